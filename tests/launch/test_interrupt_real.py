"""Stopping a real `moelab run` (2 gloo ranks under torchrun): SIGTERM, SIGINT, a second SIGINT, kill -9
of the parent, kill -9 of torchrun. Finished cases and jobs are stored, the run is `interrupted`, and no
process of the job is left; a run whose parent was killed is recovered by `moelab ingest`, once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.argv import with_flags

REPO = Path(__file__).resolve().parent.parent.parent
TOKENS = (64, 72, 80)
# about 1-2 s per case on a 2-core CPU host (more when it is busy): long enough to stop a job between two cases
WORKLOAD = [
    "--cpu", "--hidden", "256", "--tokens-per-rank", ",".join(map(str, TOKENS)), "--experts-per-rank", "4",
    "--topk", "2", "--sms", "default", "--warmup", "2", "--no-health", "--timeout", "150",
]  # fmt: skip

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


def job_processes(run_dir: Path) -> list[int]:
    """Live processes whose command line names the run directory: torchrun and its ranks."""
    needle = str(run_dir).encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and _alive(int(entry.name)):
            out.append(int(entry.name))
    return out


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def cases_done(run_dir: Path, backend: str) -> int:
    path = run_dir / backend / "progress.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"case_end"' in line)


class Run:
    """A `moelab run` in its own process, its output in a file."""

    def __init__(self, tmp_path: Path, backends: str, iters: int) -> None:
        self.db = tmp_path / "m.duckdb"
        self.run_dir = tmp_path / "runs" / "r-stop"
        self.log = tmp_path / "moelab-run.log"
        argv = [sys.executable, "-m", "moelab.cli.main", "run", "--backend", backends, *WORKLOAD,
                "--iters", str(iters), "--out", str(tmp_path / "runs"), "--run-id", "r-stop", "--db", str(self.db)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("MOELAB_DB", None)
        with self.log.open("w") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def wait_cases(self, backend: str, n: int, timeout: float = 180) -> int:
        wait_for(
            f"{n} finished case(s) of {backend}", lambda: cases_done(self.run_dir, backend) >= n, timeout
        )
        assert self.proc.poll() is None, self.output()
        return cases_done(self.run_dir, backend)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"moelab run did not exit within {timeout} s:\n{self.output()}") from None

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in job_processes(self.run_dir):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def make_run(tmp_path: Path):  # type: ignore[no-untyped-def]
    runs: list[Run] = []

    def make(backends: str, iters: int = 200) -> Run:
        runs.append(Run(tmp_path, backends, iters))
        return runs[-1]

    yield make
    for r in runs:
        r.cleanup()


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def assert_no_job_left(run_dir: Path, within: float) -> None:
    wait_for("every process of the job to end", lambda: not job_processes(run_dir), within)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_job_and_stores_what_finished(make_run, sig: signal.Signals) -> None:  # type: ignore[no-untyped-def]
    run = make_run("nccl-a2a,mxfp8-a2a")
    done = run.wait_cases("mxfp8-a2a", 1)
    run.proc.send_signal(sig)
    rc = run.finish(timeout=60)
    out = run.output()
    assert rc == 128 + sig, out
    assert f"{sig.name}: stopping the running job" in out
    assert f"run r-stop was interrupted ({sig.name}): finished cases stored" in out
    assert_no_job_left(run.run_dir, within=5)
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and info["signal"] == sig.name
    assert query(run.db, "SELECT status FROM runs") == [("interrupted",)]
    ok = dict(query(run.db, "SELECT backend, count(*) FROM cases WHERE status = 'ok' GROUP BY backend"))
    assert ok["nccl-a2a"] == len(TOKENS)  # the finished job, whole
    assert done <= ok["mxfp8-a2a"] < len(TOKENS)  # every case finished before the signal, not more
    (desc,) = query(run.db, "SELECT description FROM jobs WHERE backend = 'mxfp8-a2a'")[0]
    assert str(desc).startswith(f"interrupted by {sig.name}")
    reasons = query(
        run.db, "SELECT DISTINCT reason FROM cases WHERE backend = 'mxfp8-a2a' AND status <> 'ok'"
    )
    assert reasons and all(str(r[0]).startswith(f"interrupted by {sig.name}") for r in reasons)
    n_results = query(run.db, "SELECT count(*) FROM results")[0][0]
    assert n_results == 6 * (len(TOKENS) + ok["mxfp8-a2a"])  # six ops per phase-split, pair-chaining case


def test_a_second_ctrl_c_quits_at_once_and_the_run_stays_recoverable(make_run) -> None:  # type: ignore[no-untyped-def]
    run = make_run("nccl-a2a")
    run.wait_cases("nccl-a2a", 1)
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    run.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    rc = run.finish(timeout=15)
    assert rc == 130, run.output()
    assert time.monotonic() - t0 < 10
    assert f"moelab: quit; store what finished with: moelab ingest {run.run_dir}" in run.output()
    assert_no_job_left(run.run_dir, within=5)
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and info["stored"] is False
    result = CliRunner().invoke(app, ["ingest", str(run.run_dir), "--db", str(run.db)])
    assert result.exit_code == 0, result.output
    assert "stored run r-stop (interrupted" in result.output
    assert query(run.db, "SELECT status FROM runs") == [("interrupted",)]
    assert query(run.db, "SELECT count(*) FROM cases WHERE status = 'ok'")[0][0] >= 1


def test_kill_9_of_the_parent_leaves_no_job_and_ingest_recovers_it(make_run) -> None:  # type: ignore[no-untyped-def]
    run = make_run("nccl-a2a,mxfp8-a2a")
    done = run.wait_cases("nccl-a2a", 1)
    assert job_processes(run.run_dir)
    run.proc.kill()
    run.proc.wait()
    assert_no_job_left(run.run_dir, within=5)
    assert json.loads((run.run_dir / "run.json").read_text())["status"] == "running"
    first = CliRunner().invoke(app, ["ingest", str(run.run_dir), "--db", str(run.db)])
    assert first.exit_code == 0, first.output
    assert "is gone; marked interrupted (unfinished jobs: nccl-a2a)" in first.output
    assert query(run.db, "SELECT status FROM runs") == [("interrupted",)]
    jobs = dict(query(run.db, "SELECT backend, status FROM jobs"))
    assert jobs == {"nccl-a2a": "interrupted", "mxfp8-a2a": "not-run"}  # stopped by the user, not failed
    ok = query(run.db, "SELECT count(*) FROM cases WHERE status = 'ok'")[0][0]
    assert done <= ok < len(TOKENS)
    counts = query(
        run.db,
        "SELECT (SELECT count(*) FROM cases), (SELECT count(*) FROM results), (SELECT count(*) FROM samples)",
    )
    second = CliRunner().invoke(app, ["ingest", str(run.run_dir), "--db", str(run.db)])
    assert second.exit_code == 0, second.output
    assert "already stored" in second.output
    assert (
        query(
            run.db,
            "SELECT (SELECT count(*) FROM cases), (SELECT count(*) FROM results), (SELECT count(*) FROM samples)",
        )
        == counts
    )


def test_kill_9_of_torchrun_takes_its_ranks_along(make_run) -> None:  # type: ignore[no-untyped-def]
    run = make_run("nccl-a2a")
    run.wait_cases("nccl-a2a", 1)
    # torchrun is moelab run's child; its ranks run in sessions of their own (torch >= 2.x), so no
    # session kill reaches them: only their own parent-death signal does
    procs = job_processes(run.run_dir)
    torchrun = [p for p in procs if _ppid(p) == run.proc.pid]
    assert len(torchrun) == 1, procs
    ranks = [p for p in procs if _ppid(p) == torchrun[0]]
    assert len(ranks) == 2, procs
    os.kill(torchrun[0], signal.SIGKILL)
    wait_for("both ranks to die with torchrun", lambda: not any(_alive(p) for p in ranks), 5)
    rc = run.finish(timeout=60)
    assert rc == 1, run.output()
    (status, sig) = query(run.db, "SELECT status, signal FROM jobs")[0]
    assert sig == "SIGKILL"
    assert query(run.db, "SELECT status FROM runs") == [("failed",)]


def test_progress_lines_in_a_log_and_none_under_quiet(tmp_path: Path, db_path: Path) -> None:
    args = [
        "run",
        "--backend",
        "nccl-a2a",
        *with_flags(WORKLOAD, "--tokens-per-rank", "64,72", "--iters", "5"),
    ]
    loud = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert loud.exit_code == 0, loud.output
    lines = loud.output.splitlines()
    case_lines = [s for s in lines if s.startswith("[nccl-a2a] case ")]
    assert [s.split(":")[0] for s in case_lines] == [
        "[nccl-a2a] case 1/2 h256-t64-k2-e4-uniform-s0-bf16-smdef",
        "[nccl-a2a] case 2/2 h256-t72-k2-e4-uniform-s0-bf16-smdef",
    ]
    assert all(" on 2 cpu ranks · elapsed " in s for s in case_lines)
    assert any(s.startswith("[nccl-a2a] one-time communicator: ") for s in lines)
    assert any(s.startswith("[nccl-a2a] one-time costs (not in any measurement): ") for s in lines)
    quiet = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert "[nccl-a2a] case " not in quiet.output and "one-time" not in quiet.output
