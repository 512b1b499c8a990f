"""Processes die with their parent: real processes, the parent killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from moelab.launch.interrupt import children, session_members, signal_jobs

REPO = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _parent_of_child(child_code: str, how: str) -> tuple[subprocess.Popen[str], int]:
    """A parent process that starts a long-sleeping child running `child_code` and prints its pid."""
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from moelab.job.lifeline import job_preexec
        child = subprocess.Popen([sys.executable, "-c", {child_code!r}], stdout=subprocess.DEVNULL, {how})
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    return proc, child


def _kill_parent_and_check(proc: subprocess.Popen[str], child: int, ready: Path | None = None) -> None:
    if ready is not None:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child never got ready"
    assert alive(child)
    proc.kill()
    proc.communicate()
    try:
        assert wait_gone(child, 5.0), f"child {child} outlived its parent"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_job_started_with_preexec_gets_sigterm_when_launcher_dies(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    proc, child = _parent_of_child(code, "start_new_session=True, preexec_fn=job_preexec(os.getpid())")
    _kill_parent_and_check(proc, child, ready)


def test_worker_dies_with_its_parent(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import pathlib, time; from moelab.job.lifeline import die_with_parent; "
        f"how = die_with_parent(); pathlib.Path({str(ready)!r}).write_text(how); time.sleep(60)"
    )
    proc, child = _parent_of_child(code, "start_new_session=True")
    _kill_parent_and_check(proc, child, ready)
    assert ready.read_text() == "prctl"


def test_watchdog_fallback_ends_an_orphan(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import os, pathlib, time; from moelab.job.lifeline import start_parent_watchdog; "
        f"start_parent_watchdog(os.getppid(), poll_s=0.05); pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    proc, child = _parent_of_child(code, "start_new_session=True")
    _kill_parent_and_check(proc, child, ready)


def test_without_a_lifeline_the_orphan_survives(tmp_path: Path) -> None:
    """The control: the same child without preexec or watchdog outlives a killed parent."""
    ready = tmp_path / "ready"
    code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    proc, child = _parent_of_child(code, "start_new_session=True")
    while not ready.exists():
        time.sleep(0.05)
    proc.kill()
    proc.communicate()
    try:
        assert not wait_gone(child, 1.0)
    finally:
        os.kill(child, signal.SIGKILL)


def test_signal_jobs_hits_each_child_session_whole() -> None:
    """A child leading its own session is signalled with its whole session (its own children too)."""
    grandchild_code = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)"
    leader = subprocess.Popen(
        [sys.executable, "-c", grandchild_code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    try:
        assert leader.pid in children(os.getpid())
        assert set(session_members(leader.pid)) == {leader.pid, grandchild}
        hit = signal_jobs(signal.SIGTERM)
        assert {leader.pid, grandchild} <= set(hit)
        leader.communicate(timeout=5)
        assert wait_gone(grandchild, 5.0)
    finally:
        for pid in (leader.pid, grandchild):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
