"""Ctrl-C, SIGTERM and SIGHUP during `moelab run`: stop the running job, keep and store what finished.

    with RunInterrupt(rd) as stop:
        for backend in backends:
            if stop.requested:
                break
            ... run the job ...
        rd.set_status("interrupted" if stop.requested else ...)
        ... ingest ...

First SIGINT/SIGTERM/SIGHUP (a closed terminal or ssh session): `requested` becomes true and every job this process started (each child that
leads its own session: torchrun and its ranks) gets SIGTERM, so the launcher's wait returns, the session
is reaped as after a timeout, and the runner stores every finished case and job and marks the run
`interrupted`. A job launched after the signal (it came during a health snapshot) is stopped as it starts. A second signal does not wait for any of that: the jobs get SIGKILL, run.json says
`interrupted` (not yet stored), and the process exits with 128 + the signal number; `moelab ingest
RUN_DIR` stores it later.

Handlers can only be installed from the main thread; elsewhere the context manager does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Collection
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from moelab.job.rundir import JobFiles, RunDir

# SIGHUP is a stop like the others: left at its default it ended the run at once, nothing stored and
# run.json left `running`
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LATE_JOB_POLL_S = 0.2


def _proc_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields restart after the last ')'
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def children(pid: int) -> list[int]:
    return [p for p in _proc_pids() if _ppid(p) == pid]


def session_members(sid: int) -> list[int]:
    out = []
    for p in _proc_pids():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(p) == sid:
                out.append(p)
    return out


def signal_jobs(sig: int, parent: int | None = None, skip: Collection[int] = ()) -> list[int]:
    """Send `sig` to every job `parent` (this process) started: a child leading its own session gets it
    for its whole session (torchrun and its ranks), any other child for itself. Returns the pids hit."""
    parent = os.getpid() if parent is None else parent
    hit = []
    for child in children(parent):
        if child in skip:
            continue
        try:
            leader = os.getsid(child) == child
        except ProcessLookupError:
            continue
        if not leader and not _is_moelab_helper(child):
            continue  # not ours to stop: e.g. multiprocessing's resource tracker, which the caller still needs
        targets = session_members(child) if leader else [child]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                hit.append(pid)
    return hit


HELPER_MARKS = (b"moelab", b"alltoall_perf", b"torch.distributed.run", b"torchrun")


def _is_moelab_helper(pid: int) -> bool:
    """A child this run started that is not a job session: a health probe, nccl-tests' alltoall_perf."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(mark in cmdline for mark in HELPER_MARKS)


def _say(text: str) -> None:
    # os.write, not print: a handler may run in the middle of another print to the same stream
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode())


class RunInterrupt:
    """Signal handlers over one run; see the module docstring."""

    def __init__(self, run_dir: RunDir | None = None) -> None:
        self.run_dir = run_dir
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._stopped: set[int] = set()  # session leaders already sent SIGTERM
        self._closed = threading.Event()

    def _stop_job_sessions(self) -> None:
        for child in children(os.getpid()):
            if child in self._stopped:
                continue
            try:
                if os.getsid(child) != child:
                    continue
            except ProcessLookupError:
                continue
            self._stopped.add(child)
            for pid in session_members(child):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)

    def _stop_late_jobs(self) -> None:
        """A job that started after the signal (the signal came during a health snapshot, just before the
        launch) is stopped too, once, so the runner never waits for a whole job after Ctrl-C."""
        while not self._closed.wait(LATE_JOB_POLL_S):
            self._stop_job_sessions()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + (self.signum or 0)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            where = f" (run directory {self.run_dir.path})" if self.run_dir else ""
            _say(
                f"moelab: {signal.Signals(signum).name}: stopping the running job, then storing every finished "
                f"case{where}; signal again to quit at once"
            )
            self._stop_job_sessions()
            signal_jobs(
                signal.SIGTERM, skip=self._stopped
            )  # other children too (health probe, alltoall_perf)
            threading.Thread(target=self._stop_late_jobs, name="moelab-interrupt", daemon=True).start()
            return
        self._closed.set()
        signal_jobs(signal.SIGKILL)
        self._restore()
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                self.run_dir.set_status("interrupted", signal=self.signal_name, stored=False)
            _say(f"moelab: quit; store what finished with: moelab ingest {self.run_dir.path}")
        raise SystemExit(128 + signum)

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def __enter__(self) -> RunInterrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed.set()
        self._restore()


def note_interrupted_job(files: JobFiles, signal_name: str) -> None:
    """Say in the job's job.json that it was stopped by the user's signal, not by a fault of its own
    (a job that had finished anyway is left as it is)."""
    job = files.read_job()
    if job is None or (job.get("returncode") == 0 and not job.get("timed_out")):
        return
    job["interrupted"] = signal_name
    job["description"] = f"interrupted by {signal_name} (moelab run stopped); {job.get('description', '')}"
    files.write_job(job)
