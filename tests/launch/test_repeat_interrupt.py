"""SIGTERM in the last start of a real `moelab run --repeat 3` (2 gloo ranks under torchrun; issue 34,
fix 2): the starts that finished are stored, each case over them (and over the stopped start where it
finished before the signal), the run says which start is missing, and `moelab ingest` of the same run
directory stores the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.test_interrupt_real import (
    REPO,
    TOKENS,
    WORKLOAD,
    assert_no_job_left,
    cases_done,
    query,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


def moelab(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MOELAB_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "moelab.cli.main", *argv], env=env, cwd=cwd, capture_output=True, text=True
    )


def test_sigterm_in_the_last_start_keeps_the_starts_that_finished(tmp_path: Path) -> None:
    db, runs, log = tmp_path / "m.duckdb", tmp_path / "runs", tmp_path / "run.log"
    run_dir = runs / "r-rep"
    argv = [sys.executable, "-m", "moelab.cli.main", "run", "--backend", "nccl-a2a", *WORKLOAD,
            "--iters", "200", "--repeat", "3", "--out", str(runs), "--run-id", "r-rep", "--db", str(db)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MOELAB_DB", None)
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        last = run_dir / "nccl-a2a"  # the third start's files are in nccl-a2a/r2
        wait_for("a finished case of start 3", lambda: cases_done(last, "r2") >= 1, 400)
        done = cases_done(last, "r2")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text(errors="replace")
    assert rc == 128 + signal.SIGTERM, out
    assert "Traceback" not in out, out
    assert_no_job_left(run_dir, within=5)
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    # every case measured: over starts 1 and 2, and over start 3 too where it finished before the signal
    assert query(db, "SELECT status, count(*) FROM cases GROUP BY ALL") == [("ok", len(TOKENS))]
    repeats = [r[0] for r in query(db, "SELECT max(repeats) FROM results GROUP BY case_id ORDER BY 1")]
    assert len(repeats) == len(TOKENS) and set(repeats) <= {2, 3}
    assert done <= repeats.count(3) < len(TOKENS)
    assert query(db, "SELECT repeat, status FROM processes WHERE status <> 'ok'") == [(2, "interrupted")]
    md = tmp_path / "r.md"
    report = moelab(
        "report", "--run", "r-rep", "--format", "md", "-o", str(md), "--db", str(db), cwd=tmp_path
    )
    assert report.returncode == 0, report.stderr
    assert "run r-rep is partial: missing nccl-a2a start 3 of 3 (interrupted by SIGTERM" in md.read_text()
    # the same run directory stored again elsewhere: the same rows
    other = tmp_path / "other.duckdb"
    stored = moelab("ingest", str(run_dir), "--db", str(other), cwd=tmp_path)
    assert stored.returncode == 0, stored.stderr
    sql = "SELECT case_id, op, repeats, median_us FROM results ORDER BY ALL"
    assert query(other, sql) == query(db, sql)
