"""The stores committed under results/ (exports of GPU runs), read back through the command a user types:
tests that hold a reader to real GPU data import them with this one helper."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from moelab.cli.main import app

RESULTS = Path(__file__).resolve().parents[1] / "results"


def import_export(export: Path, db: Path) -> str:
    """`moelab db import EXPORT --db DB`, which must succeed; its standard output."""
    r = CliRunner().invoke(app, ["db", "import", str(export), "--db", str(db)])
    assert r.exit_code == 0, r.output
    return r.stdout
