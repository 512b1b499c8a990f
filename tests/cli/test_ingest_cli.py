"""`moelab ingest RUN_DIR` on synthetic run directories: stores once, recovers a run whose launcher died,
refuses a run still running or not a run directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.job.rundir import RunDir, process_start
from tests.synthetic_runs import BackendModel, RunModel, write_run

COUNTED = ("runs", "jobs", "cases", "results", "samples", "bandwidths")


def _counts(db: Path, run_id: str) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]  # type: ignore[index]
            for t in COUNTED
        }
    finally:
        con.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _abandoned(tmp_path: Path, pid: int, host: str | None = None) -> Path:
    """A run whose launcher died mid-way: run.json 'running', the second backend's job without job.json."""
    run_dir = write_run(
        tmp_path / "runs",
        RunModel(run_id="r-abandoned", backends=(BackendModel(name="nccl-a2a"), BackendModel(name="deepep"))),
    )
    (run_dir / "deepep" / "job.json").unlink()
    (run_dir / "deepep" / "rank0.log").write_text("moelab worker rank 0/2\ncase x: ok\n")
    info = json.loads((run_dir / "run.json").read_text())
    info.update(status="running", pid=pid, host=host or socket.gethostname(), pid_start=process_start(pid))
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def test_a_run_never_stored_is_stored_once(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", RunModel(run_id="r-once", tokens=(256, 512)))
    db = tmp_path / "m.duckdb"
    first = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db)])
    assert first.exit_code == 0, first.output
    assert "stored run r-once (complete; cases: 2 ok)" in first.output
    counts = _counts(db, "r-once")
    assert counts["runs"] == 1 and counts["cases"] == 2 and counts["results"] == 6 and counts["samples"] > 0
    second = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db)])
    assert second.exit_code == 0, second.output
    assert "already stored" in second.output
    assert _counts(db, "r-once") == counts
    again = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db), "--replace"])
    assert again.exit_code == 0, again.output
    assert "stored run r-once" in again.output
    assert _counts(db, "r-once") == counts


def test_a_run_whose_launcher_died_is_marked_interrupted_and_stored(tmp_path: Path) -> None:
    run_dir = _abandoned(tmp_path, _dead_pid())
    db = tmp_path / "m.duckdb"
    result = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "marked interrupted (unfinished jobs: deepep)" in result.output
    info = RunDir(run_dir).info()
    assert info["status"] == "interrupted" and "is gone" in info["reason"]
    job = json.loads((run_dir / "deepep" / "job.json").read_text())
    assert job["description"].startswith("job did not finish: launcher pid")
    assert "case x: ok" in job["stderr_tails"]["0"]
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
        jobs = dict(con.execute("SELECT backend, status FROM jobs").fetchall())
        assert jobs == {"nccl-a2a": "ok", "deepep": "interrupted"}
        # the cases the dead job had finished are stored as measured
        assert con.execute("SELECT DISTINCT status FROM cases").fetchall() == [("ok",)]
    finally:
        con.close()
    second = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db)])
    assert second.exit_code == 0 and "already stored" in second.output


def test_a_run_still_running_is_refused(tmp_path: Path) -> None:
    run_dir = _abandoned(tmp_path, os.getpid())
    db = tmp_path / "m.duckdb"
    result = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: run r-abandoned is still running (pid {os.getpid()} on this host); it stores itself when done"
    ]
    assert not db.exists()
    assert RunDir(run_dir).info()["status"] == "running"


def test_another_hosts_run_needs_force(tmp_path: Path) -> None:
    run_dir = _abandoned(tmp_path, 4242, host="some-other-node")
    db = tmp_path / "m.duckdb"
    refused = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db)])
    assert refused.exit_code == 2
    assert "on host some-other-node, which this host cannot check" in refused.output
    forced = CliRunner().invoke(app, ["ingest", str(run_dir), "--db", str(db), "--force"])
    assert forced.exit_code == 0, forced.output
    assert RunDir(run_dir).info()["status"] == "interrupted"


@pytest.mark.parametrize("make", ["missing", "empty", "junk-spec"])
def test_not_a_run_directory_is_one_error_line(tmp_path: Path, make: str) -> None:
    target = tmp_path / "x"
    if make != "missing":
        target.mkdir()
    if make == "junk-spec":
        (target / "spec.json").write_text("{not json")
    db = tmp_path / "m.duckdb"
    result = CliRunner().invoke(app, ["ingest", str(target), "--db", str(db)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not db.exists()
