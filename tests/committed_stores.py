"""The stores committed under results/ (exports of GPU runs), read back through the command a user types:
tests that hold a reader to real GPU data import them with this one helper."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app

RESULTS = Path(__file__).resolve().parents[1] / "results"


def import_export(export: Path, db: Path) -> str:
    """`moelab db import EXPORT --db DB`, which must succeed; its standard output."""
    r = CliRunner().invoke(app, ["db", "import", str(export), "--db", str(db)])
    assert r.exit_code == 0, r.output
    return r.stdout


def imported_store(export: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    """A fresh store at a temporary path holding `export` (for a module-scoped fixture)."""
    db = tmp_path_factory.mktemp(name) / f"{name}.duckdb"
    import_export(export, db)
    return str(db)


def markdown_rows(lines: list[str]) -> list[list[str]]:
    """The cells of each `| a | b |` row among `lines` (a table's body, its header and rule cut off)."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]


def best_schedule_rows(md: str) -> list[list[str]]:
    """The cells of every row of a markdown report's "Fastest overlapped layer per backend" tables."""
    rows = []
    for block in md.split("Fastest overlapped layer per backend")[1:]:
        rows += markdown_rows(block.split("\n\n")[1].splitlines()[2:])
    return rows
