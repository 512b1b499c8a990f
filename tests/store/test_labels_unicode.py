"""Labels through `moelab label` and `moelab db export` (issue 41): unicode, right-to-left and emoji names
survive an export; composed and decomposed forms are one label; invisible characters are refused."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.store.db import migrate
from moelab.store.export import load_export
from tests.synthetic_runs import RunModel, build_db

NAMES = ["café", "ナイトリー", "שלום-main", "مرحبا", "🚀-fast", "👩‍💻 dev", "Ωmega v2"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "l.duckdb"
    build_db(path, tmp_path / "runs", [RunModel(run_id="r1", iters=5), RunModel(run_id="r2", iters=5)])
    return path


def _moelab(*argv: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(app, list(argv))
    return out.exit_code, out.stdout, out.stderr


def test_an_export_carries_every_label(db: Path, tmp_path: Path) -> None:
    for i, name in enumerate(NAMES):
        assert _moelab("label", f"r{i % 2 + 1}", name, "--db", str(db))[0] == 0
    code, _, err = _moelab("db", "export", "--out", str(tmp_path / "e"), "--db", str(db))
    assert code == 0, err
    mem = duckdb.connect(":memory:")
    migrate(mem)
    load_export(mem, tmp_path / "e")
    got = dict(mem.execute("SELECT label, run_id FROM labels").fetchall())
    assert got == {name: f"r{i % 2 + 1}" for i, name in enumerate(NAMES)}


def test_composed_and_decomposed_are_one_label(db: Path) -> None:
    assert _moelab("label", "r1", "caf\u00e9", "--db", str(db))[0] == 0
    code, out, _ = _moelab("label", "r2", "cafe\u0301", "--db", str(db))
    assert code == 0 and "moved from run r1" in out
    _, listing, _ = _moelab("label", "--list", "--db", str(db))
    assert listing.count("caf") == 1


@pytest.mark.parametrize("name", ["night\u200bly", "\ufeffmain", "a\u00adb", "x\u2066y", "\u3164"])
def test_invisible_characters_are_refused(db: Path, name: str) -> None:
    code, _, err = _moelab("label", "r1", name, "--db", str(db))
    assert code == 2 and "invisible characters" in err
