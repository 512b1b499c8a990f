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


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # the user's suite replaced with HTML
        (["run", "--cpu", "--suite", "{suite}", "--report", "{suite}", "--out", "{tmp}/out"], "is the file --suite reads"),
        # a built-in suite, inside the installed package
        (["run", "--cpu", "--suite", "dispatch-combine", "--report", "{builtin}", "--out", "{tmp}/out"], "is the file --suite reads"),
        (["compare", "--by", "run", "--peaks", "{peaks}", "--html", "{peaks}"], "is the file --peaks reads"),
        (["check", "-B", "base", "--summary", "{tmp}/a.md", "--junit", "{tmp}/./a.md"], "--summary and --junit name one file"),
    ],
)  # fmt: skip
def test_an_output_that_is_an_input_or_another_output_is_refused(
    store: Path, tmp_path: Path, argv: list[str], needle: str
) -> None:
    from moelab.suites.loader import suite_file

    suite, peaks = tmp_path / "s.toml", tmp_path / "peaks.toml"
    suite.write_text(
        'name = "s"\n[workload]\nhidden = 128\ntokens_per_rank = 16\ntopk = 2\nexperts_per_rank = 2\n'
    )
    peaks.write_text('[gpu."H100"]\ngbps = 400\n')
    kept = {p: p.read_bytes() for p in (suite, peaks, suite_file("dispatch-combine"))}
    args = [
        a.format(suite=suite, peaks=peaks, tmp=tmp_path, builtin=suite_file("dispatch-combine")) for a in argv
    ]
    res = CliRunner().invoke(app, [*args, "--db", str(store)])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and needle in res.stderr, (
        res.stderr
    )
    assert all(p.read_bytes() == body for p, body in kept.items())
    assert not (tmp_path / "out").exists() and not (tmp_path / "a.md").exists()
