"""No process outlives its job: a helper a backend started in a session of its own, and a rank stopped
with SIGSTOP, are ended when the job ends and recorded in job.json as the leftovers found; a job killed
for its time ends within a few seconds of --timeout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.argv import with_flags
from tests.launch.test_crash_isolation import SMALL, _alive, _pids_from_logs

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, backend: str, *extra: str) -> tuple[int, Path]:
    runs = tmp_path / "runs"
    args = [
        "run",
        "--backend",
        backend,
        "--cpu",
        "--out",
        str(runs),
        "--no-health",
        *with_flags(SMALL, *extra),
    ]
    result = CliRunner().invoke(app, args)
    return result.exit_code, next(runs.iterdir()) / backend


def test_a_helper_a_backend_leaves_behind_is_ended_and_recorded(
    plugin_path: Path, db_path: Path, tmp_path: Path
) -> None:
    code, job_dir = _run(tmp_path, "test-spawner")
    assert code == 0
    helpers = [
        int(m)
        for log in job_dir.glob("rank*.log")
        for m in re.findall(r"spawned helper pid (\d+)", log.read_text())
    ]
    assert len(helpers) == 2
    assert not any(_alive(pid) for pid in helpers)
    job = json.loads((job_dir / "job.json").read_text())
    assert set(helpers) <= set(job["leftover_pids"])


def test_a_stopped_rank_is_ended_and_the_timeout_is_kept(
    plugin_path: Path, db_path: Path, tmp_path: Path
) -> None:
    timeout = 12.0
    code, job_dir = _run(tmp_path, "test-stop", "--timeout", str(timeout), "--collective-timeout", "60")
    assert code == 1
    job = json.loads((job_dir / "job.json").read_text())
    assert job["timed_out"]
    assert job["duration_s"] <= timeout + 5  # stack dumps, SIGTERM, then SIGKILL: seconds, not tens
    for pid in _pids_from_logs(job_dir.parent, "test-stop"):
        assert not _alive(pid), f"rank {pid} survived its job"
