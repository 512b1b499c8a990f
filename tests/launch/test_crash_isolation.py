"""A backend that segfaults, raises or hangs on one rank ends in a recorded failure within the timeout,
leaves no process behind, and the next backend of the run still measures."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app

SMALL = [
    "--hidden",
    "128",
    "--tokens-per-rank",
    "16",
    "--topk",
    "2",
    "--experts-per-rank",
    "2",
    "--iters",
    "2",
    "--warmup",
    "0",
    "--sms",
    "default",
]


def _pids_from_logs(run_dir: Path, backend: str) -> list[int]:
    pids = []
    for log in (run_dir / backend).glob("rank*.log"):
        m = re.search(r"pid (\d+)", log.read_text(errors="replace"))
        if m:
            pids.append(int(m.group(1)))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad,expect_status,expect_text",
    [
        ("test-segv", "crashed", "SIGSEGV"),
        ("test-raise", "failed", "deliberate failure"),
        ("test-hang", "failed", "timed out"),
        ("test-hang-all", "timeout", "timed out"),
    ],
)
def test_bad_backend_is_recorded_and_next_backend_runs(
    plugin_path: Path, db_path: Path, tmp_path: Path, bad: str, expect_status: str, expect_text: str
) -> None:
    runs = tmp_path / "runs"
    args = [
        "run",
        "--backend",
        f"{bad},nccl-a2a",
        "--cpu",
        "--out",
        str(runs),
        "--timeout",
        "40",
        "--collective-timeout",
        "8",
        *SMALL,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    run_dir = next(runs.iterdir())
    job = json.loads((run_dir / bad / "job.json").read_text())
    assert job["duration_s"] < 40 + 25
    assert job["leftover_pids"] == []
    for pid in _pids_from_logs(run_dir, bad):
        assert not _alive(pid), f"rank process {pid} of {bad} survived"
    con = duckdb.connect(str(db_path), read_only=True)
    status, desc, tails = con.execute(
        "SELECT status, description, CAST(stderr_tails AS VARCHAR) FROM jobs WHERE backend = ?", [bad]
    ).fetchone()
    assert status == expect_status
    assert expect_text.lower() in (desc + tails).lower()
    case_status = con.execute("SELECT DISTINCT status FROM cases WHERE backend = ?", [bad]).fetchall()
    assert case_status == [("failed",)]
    ok = con.execute("SELECT count(*) FROM results WHERE backend = 'nccl-a2a'").fetchone()[0]
    assert ok == 6  # layout, dispatch, dispatch_fresh, combine, roundtrip, pair of the next backend
    con.close()
