"""The failure headline names the rank that caused a failure (issue 41): the one whose heartbeat ended
first (stopped by SIGSTOP, exited 0 mid-dispatch, died without a record), not the peer that only timed out
waiting for it. The read of a job's files, here; real jobs that stop, exit 0 or are killed are rows of the
hostile table (tests/hostile/checked_rows.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from moelab.job.diagnosis import read_diagnosis


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
