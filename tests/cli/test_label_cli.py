"""`moelab label`: naming runs, moving names, and how names resolve (labels table, runs.label, run id)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moelab.cli.label_cmd import label
from moelab.core.errors import MoelabError
from moelab.store import labels
from moelab.store.db import connect
from tests.synthetic_runs import RunModel, build_db


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "l.duckdb"
    build_db(path, tmp_path / "runs", [
        RunModel(run_id="r1", created_at="2026-11-20T07:00:00+00:00", label="nightly", iters=5),
        RunModel(run_id="r2", created_at="2026-11-21T07:00:00+00:00", label="nightly", iters=5),
        RunModel(run_id="r3", created_at="2026-11-22T07:00:00+00:00", iters=5),
    ])  # fmt: skip
    return path


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("label")(label)
    app.command("noop")(lambda: None)
    return app


def _resolve(db: Path, ref: str) -> str:
    con = connect(db, read_only=True)
    try:
        return labels.resolve_run(con, ref)
    finally:
        con.close()


def test_resolution_order(db: Path) -> None:
    assert _resolve(db, "nightly") == "r2"  # newest run with that runs.label
    assert _resolve(db, "r1") == "r1"
    con = connect(db)
    try:
        assert labels.set_label(con, "r1", "nightly") is None
    finally:
        con.close()
    assert _resolve(db, "nightly") == "r1"  # the labels table wins over runs.label
    with pytest.raises(MoelabError, match="neither a label nor a run id"):
        _resolve(db, "weekly")


def test_label_moves_and_lists(db: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(_app(), ["label", "r1", "main", "--db", str(db)])
    assert r.exit_code == 0 and "label main -> run r1" in r.output
    r = runner.invoke(_app(), ["label", "latest", "main", "--db", str(db)])
    assert r.exit_code == 0 and "moved from run r1" in r.output and "run r3" in r.output
    assert _resolve(db, "main") == "r3"
    r = runner.invoke(_app(), ["label", "--list", "--db", str(db)])
    assert r.exit_code == 0 and "main" in r.output and "r3" in r.output
    r = runner.invoke(_app(), ["label", "--remove", "main", "--db", str(db)])
    assert r.exit_code == 0
    with pytest.raises(MoelabError):
        _resolve(db, "main")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope", "x"], "neither a label"),
        (["r1", "  "], "cannot be empty"),
        (["r1"], "give RUN and NAME"),
        (["--remove", "zzz"], "no such label"),
        (["r1", "a\tb"], "control characters"),
        (["r1", "v1,v2"], "holds a comma"),  # `report --run v1,v2` would read runs v1 and v2
    ],
)
def test_usage_errors(db: Path, argv: list[str], message: str) -> None:
    r = CliRunner().invoke(_app(), ["label", *argv, "--db", str(db)])
    assert r.exit_code == 2 and message in r.output, r.output


def test_label_lands_in_report(db: Path, tmp_path: Path) -> None:
    from moelab.reports.html import write_report

    con = connect(db)
    try:
        labels.set_label(con, "r3", "release-1.0")
    finally:
        con.close()
    text = write_report(db, ["r3"], tmp_path / "r.html").read_text()
    assert "release-1.0" in text


def test_a_run_id_goes_before_another_runs_own_label(tmp_path: Path) -> None:
    """The GPU acceptance stored run acc-a2a and, later, run acc-a2a-lib, both with --label acc-a2a:
    `check --run acc-a2a` checked acc-a2a-lib (the label pointed at the newest run) and found no case to
    match. A run id names one run for good."""
    path = tmp_path / "a.duckdb"
    build_db(path, tmp_path / "runs", [
        RunModel(run_id="acc-a2a", created_at="2026-11-20T07:00:00+00:00", label="acc-a2a", iters=5),
        RunModel(run_id="acc-a2a-lib", created_at="2026-11-20T07:05:00+00:00", label="acc-a2a", iters=5),
    ])  # fmt: skip
    assert _resolve(path, "acc-a2a") == "acc-a2a"
    assert _resolve(path, "acc-a2a-lib") == "acc-a2a-lib"
    # a label may not be another run's id (it would hide that run, or be hidden by it)
    result = CliRunner().invoke(_app(), ["label", "acc-a2a-lib", "acc-a2a", "--db", str(path)])
    assert result.exit_code != 0 and "is the id of another run" in result.output
    assert _resolve(path, "acc-a2a") == "acc-a2a"


def test_run_refuses_a_label_that_is_another_runs_id_before_measuring(db: Path, tmp_path: Path) -> None:
    from moelab.cli.main import app

    argv = [
        "run",
        "--cpu",
        "--gpus",
        "1",
        "--backend",
        "nccl-a2a",
        "--hidden",
        "64",
        "--tokens-per-rank",
        "16",
    ]
    argv += ["--iters", "2", "--warmup", "1", "--label", "r1", "--db", str(db), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0 and "is the id of another run" in result.output
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())  # nothing measured
    con = connect(db, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    finally:
        con.close()
