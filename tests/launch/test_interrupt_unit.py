"""RunInterrupt in this process: real signals, real child sessions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moelab.job.rundir import JobFiles
from moelab.launch.interrupt import RunInterrupt, note_interrupted_job

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _job() -> subprocess.Popen[bytes]:
    return subprocess.Popen(SLEEPER, start_new_session=True)


def test_first_signal_stops_running_and_late_jobs_and_sets_the_flag() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    running = _job()
    late = None
    try:
        with RunInterrupt() as stop:
            assert not stop.requested
            os.kill(os.getpid(), signal.SIGTERM)
            assert running.wait(timeout=5) == -signal.SIGTERM
            assert stop.requested and stop.signal_name == "SIGTERM" and stop.exit_code == 143
            late = _job()  # launched after the signal: stopped as it starts
            assert late.wait(timeout=5) == -signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        for p in (running, late):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_second_signal_kills_the_jobs_and_exits_with_128_plus_signal() -> None:
    previous = signal.getsignal(signal.SIGINT)
    # a job that ignores SIGTERM: only the second signal's SIGKILL ends it
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None
    stubborn.stdout.readline()
    try:
        with pytest.raises(SystemExit) as exc, RunInterrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            assert stubborn.poll() is None  # SIGTERM ignored
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this ends
        assert exc.value.code == 130
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
        assert signal.getsignal(signal.SIGINT) is previous
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.communicate()


def test_note_interrupted_job_marks_only_a_job_that_did_not_finish(tmp_path: Path) -> None:
    stopped, finished = JobFiles(tmp_path, "a"), JobFiles(tmp_path, "b")
    stopped.write_job({"returncode": 1, "timed_out": False, "description": "exit code 1"})
    finished.write_job({"returncode": 0, "timed_out": False, "description": "ok"})
    note_interrupted_job(stopped, "SIGINT")
    note_interrupted_job(finished, "SIGINT")
    note_interrupted_job(JobFiles(tmp_path, "never-started"), "SIGINT")
    assert stopped.read_job() == {
        "returncode": 1, "timed_out": False, "interrupted": "SIGINT",
        "description": "interrupted by SIGINT (moelab run stopped); exit code 1",
    }  # fmt: skip
    assert finished.read_job() == {"returncode": 0, "timed_out": False, "description": "ok"}
    assert JobFiles(tmp_path, "never-started").read_job() is None
