"""The failure headline names the rank that caused a failure (issue 41): the one whose heartbeat ended
first (stopped by SIGSTOP, exited 0 mid-dispatch, died without a record), not the peer that only timed out
waiting for it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.job.diagnosis import read_diagnosis
from tests.launch.test_crash_isolation import SMALL


def _job(tmp_path: Path, beats: dict[int, float]) -> Path:
    job = tmp_path / "nccl-a2a"
    job.mkdir()
    now = time.time()
    for rank, ago in beats.items():
        (job / f"rank{rank}.log").write_text(f"moelab worker rank {rank}/2\n")
        beat = job / f"rank{rank}.heartbeat"
        beat.touch()
        os.utime(beat, (now - ago, now - ago))
    error = {"type": "DistBackendError", "message": "Timed out waiting 8000ms for recv from rank 1"}
    (job / "rank0.error.json").write_text(json.dumps(error))
    return job


def test_the_rank_whose_heartbeat_ended_first_is_named(tmp_path: Path) -> None:
    diag = read_diagnosis(_job(tmp_path, {0: 1.0, 1: 30.0}))
    headline = diag.headline() or ""
    assert headline.startswith("rank 1 stopped first (its heartbeat ended 29 s before"), headline
    assert "rank 0: DistBackendError" in headline  # the consequence still shown, after the cause


def test_heartbeats_ending_together_name_no_one(tmp_path: Path) -> None:
    job = _job(tmp_path, {0: 1.0, 1: 2.0})
    error = {"type": "DistBackendError", "message": "Timed out waiting 8000ms for recv from rank 0"}
    (job / "rank1.error.json").write_text(json.dumps(error))  # both lost each other: no one stands out
    headline = read_diagnosis(job).headline() or ""
    assert headline.startswith("rank 0: DistBackendError"), headline


def test_the_one_rank_that_left_no_error_is_named(tmp_path: Path) -> None:
    headline = read_diagnosis(_job(tmp_path, {0: 1.0, 1: 2.0})).headline() or ""
    assert headline.startswith("rank 1 ended first, leaving no error"), headline


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["test-stop", "test-exit0"])
def test_a_real_job_names_the_rank_that_stopped(
    plugin_path: Path, db_path: Path, tmp_path: Path, backend: str
) -> None:
    args = ["run", "--backend", backend, "--cpu", "--out", str(tmp_path / "runs"), "--timeout", "60",
            "--collective-timeout", "10", "--no-health", *SMALL]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        rows = con.execute(
            "SELECT rank, root_cause, headline FROM failure_diagnosis WHERE backend = ? ORDER BY rank",
            [backend],
        ).fetchall()
    finally:
        con.close()
    assert rows, result.output
    first = {"test-stop": "rank 1 stopped first", "test-exit0": "rank 1 ended first, leaving no error"}[
        backend
    ]
    assert str(rows[0][2]).startswith(first), rows
    assert [r[0] for r in rows if r[1]] == [1], rows
    assert f"cause: {first}" in result.output
