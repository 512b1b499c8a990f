"""An output file (a report, a summary, a suite) that is the database itself is refused before anything is
written: `report -o moelab.duckdb` replaced the store with HTML, `check --summary` appended Markdown to it,
and every stored run was lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.store.db import connect
from moelab.store.ingest import ingest
from tests.synthetic_runs import RunModel, write_run


@pytest.fixture
def store(tmp_path: Path) -> Path:
    db = tmp_path / "m.duckdb"
    con = connect(db)
    for run_id, label in (("r1", "base"), ("r2", None)):
        ingest(con, write_run(tmp_path / "runs", RunModel(run_id=run_id, label=label, iters=8)))
    con.close()
    return db


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "-o", "{db}"],
        ["report", "--format", "md", "-o", "{link}"],  # a symbolic link to the store
        ["report", "--history", "-o", "{db}.wal"],  # its write-ahead log
        ["compare", "--by", "run", "--html", "{db}"],
        ["check", "-B", "base", "--summary", "{db}"],
        ["check", "-B", "base", "--junit", "{db}"],
        ["run", "--cpu", "--report", "{db}", "--out", "{tmp}/out"],
        ["tune", "--cpu", "--backend", "nccl-a2a", "--suite-out", "{db}", "--out", "{tmp}/out"],
    ],
)
def test_an_output_that_is_the_store_is_refused(store: Path, tmp_path: Path, argv: list[str]) -> None:
    link = tmp_path / "link.duckdb"
    os.symlink(store, link)
    before = store.read_bytes()
    args = [a.format(db=store, link=link, tmp=tmp_path) for a in argv]
    res = CliRunner().invoke(app, [*args, "--db", str(store)])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "is the database (--db" in res.stderr and "would destroy every run" in res.stderr
    assert store.read_bytes() == before and not (tmp_path / "m.duckdb.wal").exists()
    assert not (tmp_path / "out").exists()
