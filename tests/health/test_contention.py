"""Contention: the registry of running runs with real processes (two at once, a stale one, one that came
and went inside a job), host load, other GPU processes, marking cases suspect, and spread flags against a
noise target and a case's own history in a store built by the real ingest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from moelab.health import contention, run_registry
from moelab.job.rundir import JobFiles
from moelab.store import run_history
from moelab.store.db import connect
from moelab.store.judgments import judge
from tests.synthetic_runs import RunModel, build_db

ROOT = Path(__file__).resolve().parent.parent.parent

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from moelab.health.run_registry import register
    with register(sys.argv[2], Path(sys.argv[1])):
        print("registered", flush=True)
        time.sleep(float(sys.argv[3]))
    print("done", flush=True)
    """
)


def _holder(root: Path, run_id: str, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root), run_id, str(seconds)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "registry"


def test_two_runs_at_once_see_each_other_and_a_dead_one_is_stale(root: Path) -> None:
    a = _holder(root, "run-a", 60)
    b = _holder(root, "run-b", 60)
    try:
        assert {e.run_id for e in run_registry.running_runs(root)} == {"run-a", "run-b"}
        others = run_registry.running_runs(root, exclude="run-a")
        assert [(e.run_id, e.pid) for e in others] == [("run-b", b.pid)]
        found = contention.check("run-a", root=root, nvml=_NoGpus())
        assert [f.kind for f in found if f.kind == "moelab-run"] == ["moelab-run"]
        assert "run-b" in (contention.suspect_reason(found) or "")
        b.send_signal(signal.SIGKILL)  # dies without cleaning up: its entry stays, its lock goes
        b.wait()
        assert (root / f"run-b.{b.pid}.run.json").exists()
        assert [e.run_id for e in run_registry.running_runs(root)] == ["run-a"]
    finally:
        _end(a)
        _end(b)
    assert run_registry.running_runs(root) == []


def test_a_run_that_came_and_went_during_a_job_is_found(root: Path) -> None:
    with contention.ContentionMonitor("mine", interval_s=30.0, root=root) as monitor:
        short = _holder(root, "brief", 0.1)
        assert short.stdout is not None and short.stdout.readline().strip() == "done"
        _end(short)
    assert [f.subject for f in monitor.findings if f.kind == "moelab-run"] == ["brief"]
    later = run_registry.overlapping_runs(time.time() + 1, time.time() + 2, root, exclude="mine")
    assert later == []  # it ended before that window


def test_registration_ends_cleanly(root: Path) -> None:
    with run_registry.register("solo", root) as reg:
        assert reg.entry.pid == os.getpid()
        assert [e.run_id for e in run_registry.running_runs(root)] == ["solo"]
    assert run_registry.running_runs(root) == []
    assert list(root.glob("solo.*.run.json")) == []


def test_host_load_against_cores() -> None:
    assert contention.load_findings(own_busy=2, cores=4, loadavg=lambda: (3.0, 0.0, 0.0)) == []
    found = contention.load_findings(own_busy=2, cores=4, loadavg=lambda: (6.5, 0.0, 0.0))
    assert len(found) == 1 and "host load 6.5 on 4 cores (4.5 beyond this run's 2 ranks)" in found[0].reason


class _NoGpus:
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 0


class _TwoGpus(_NoGpus):
    """pynvml's calls for running processes, with the shapes nvidia-ml-py returns (objects with .pid)."""

    def __init__(self, procs: dict[int, list[int]]) -> None:
        self.procs = procs

    def nvmlDeviceGetCount(self) -> int:
        return len(self.procs)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self.procs[h]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        return []


def test_other_gpu_processes_are_named_ours_are_not() -> None:
    found = contention.gpu_process_findings(_TwoGpus({0: [100, 200], 1: [101]}), own_pids=[100, 101])
    assert [(f.subject, f.reason) for f in found] == [("GPU 0", "1 other process(es) on GPU 0 (pid 200)")]


def test_findings_round_trip_and_mark_suspect(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    build_db(db, tmp_path / "runs", [RunModel(run_id="r1", iters=8, tokens=(256, 512))])
    found = [contention.ContentionFinding("moelab-run", "r0", "another moelab run (r0, pid 1) ran on h")]
    files = JobFiles.of_dir(tmp_path / "job")
    files.write_contention([f.to_dict() for f in found])
    assert [contention.ContentionFinding.from_dict(d) for d in files.read_contention()] == found
    assert contention.job_suspect_reason(files.read_contention()) == contention.suspect_reason(found)
    reason = contention.suspect_reason(found)
    assert reason is not None and contention.job_suspect_reason([], "health: x") == "health: x"
    assert contention.job_suspect_reason([f.to_dict() for f in found], "health: x") == f"health: x; {reason}"
    assert contention.job_suspect_reason([]) is None


def test_spread_far_above_history_or_target_is_flagged(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    quiet = [RunModel(run_id=f"h{i}", created_at=f"2026-11-1{i}T07:00:00+00:00", noise=0.01, seed=i, iters=60)
             for i in range(4)]  # fmt: skip
    build_db(db, tmp_path / "runs", [
        *quiet,
        RunModel(run_id="calm", created_at="2026-11-20T07:00:00+00:00", noise=0.01, seed=9, iters=60),
        RunModel(run_id="noisy", created_at="2026-11-21T07:00:00+00:00", noise=0.25, seed=7, iters=60),
    ])  # fmt: skip
    con = connect(db)
    try:
        assert run_history.spread_flags(con, "calm") == []
        flags = run_history.spread_flags(con, "noisy")
        assert flags and all(f.basis == "history (5 runs)" for f in flags)
        assert {f.op for f in flags} >= {"dispatch"}
        judged = judge(con, "noisy")
        assert ("spread", "suspect") in {(j.rule, j.verdict) for j in judged}
        n = con.execute("SELECT count(*) FROM cases_judged WHERE run_id = 'noisy' AND suspect").fetchone()[0]
        assert n >= 1
        assert con.execute("SELECT count(*) FROM cases WHERE run_id = 'noisy' AND suspect").fetchone()[0] == 0
        # no history: the noise target is the bar
        first = run_history.spread_flags(con, "h0", noise_target=0.001)
        assert first and all(f.basis == "noise target" for f in first)
        assert run_history.spread_flags(con, "h0") == []
        assert run_history.spread_flags(con, "noisy", devices=("cpu",)) == []
    finally:
        con.close()


@pytest.mark.slow
def test_a_run_beside_another_is_marked_suspect_and_says_why(db_path: Path, tmp_path: Path) -> None:
    """A real `moelab run` on CPU ranks while another (registered) moelab run holds the host."""
    import duckdb
    from typer.testing import CliRunner

    from moelab.cli.main import app
    from tests.launch.test_crash_isolation import SMALL

    other = _holder(run_registry.registry_root(), "someone-elses-run", 300)
    try:
        args = ["run", "--cpu", "--out", str(tmp_path / "runs"), "--no-health", *SMALL]
        result = CliRunner().invoke(app, args)
    finally:
        _end(other)
    assert result.exit_code == 0, result.output
    assert "suspect" in result.output and "someone-elses-run" in result.output
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        rows = con.execute("SELECT suspect, suspect_reason FROM cases WHERE status = 'ok'").fetchall()
    finally:
        con.close()
    assert rows and all(s and "moelab-run: another moelab run (someone-elses-run" in r for s, r in rows)


def _orphan(*args: str) -> int:
    """A sleeping python that is not below us (its shell parent exits at once), with `args` on its line."""
    line = " ".join([sys.executable, "-c", "'import time; time.sleep(60)'", *args])
    out = subprocess.run(
        ["sh", "-c", f"{line} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def test_our_processes_include_children_and_processes_naming_the_run() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rank = _orphan("/runs/run-xyz/nccl-a2a")  # as an srun rank: a child of slurmstepd, naming our run dir
    stranger = _orphan("/runs/other-run/nccl-a2a")
    try:
        own = contention.our_processes("run-xyz")
        assert os.getpid() in own and child.pid in own and rank in own
        assert stranger not in own
        assert rank not in contention.our_processes("run-abc")
    finally:
        child.kill()
        child.wait()
        for pid in (rank, stranger):
            os.kill(pid, signal.SIGKILL)


def test_history_stays_bounded(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_registry, "HISTORY_MAX_BYTES", 2000)
    for i in range(60):
        with run_registry.register(f"r{i}", root):
            pass
    size = (root / "history.jsonl").stat().st_size
    assert size < 4000
    assert "r59" in (root / "history.jsonl").read_text()
