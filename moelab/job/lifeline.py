"""Processes that die with their parent, so a launcher killed without warning (kill -9, OOM killer)
leaves no job behind: `moelab run` → torchrun → workers.

- The launcher starts each job with `preexec_fn=job_preexec(os.getpid())`: the job's leader (torchrun)
  gets SIGTERM when `moelab run` dies, and torchrun's agent then stops its ranks.
- Each worker calls `die_with_parent()` first thing: when its own parent (torchrun, nsys, srun's step)
  dies, it gets SIGKILL; there is nobody left to report to, and every finished case is already on disk.

Linux has prctl(PR_SET_PDEATHSIG). Elsewhere `die_with_parent` falls back to a watchdog thread that
polls the parent pid. The signal is tied to the parent *thread*: the launcher must start jobs from a
thread that lives as long as the job (the main thread does).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
WATCHDOG_POLL_S = 0.5


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


_PRCTL = _load_prctl()  # resolved once, in the parent: a forked child must not load libraries


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; False where unsupported."""
    if _PRCTL is None:
        return False
    return _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """While inside, this process is the one its descendants' orphans re-parent to (Linux): a rank in a
    session of its own, or a daemon a backend started, stays findable below the launcher after torchrun is
    gone, so the launcher can end it (and must reap it: moelab.job.local). Yields False where unsupported.
    Only for the length of a job, so that other programs' orphans still go to init."""
    on = _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield on
    finally:
        if on and _PRCTL is not None:
            _PRCTL(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def job_preexec(parent_pid: int, sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets `sig` when `parent_pid` (the launcher) dies. If the launcher
    died between fork and this call, the child ends at once instead of running orphaned."""

    def preexec() -> None:
        set_parent_death_signal(sig)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sig)

    return preexec


def _watchdog(parent_pid: int, sig: int, poll_s: float) -> None:
    while True:
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sig)
            return
        threading.Event().wait(poll_s)


def start_parent_watchdog(
    parent_pid: int, sig: int = signal.SIGKILL, poll_s: float = WATCHDOG_POLL_S
) -> threading.Thread:
    """A daemon thread that sends `sig` to this process once its parent is no longer `parent_pid`."""
    thread = threading.Thread(
        target=_watchdog, args=(parent_pid, sig, poll_s), name="moelab-parent-watchdog", daemon=True
    )
    thread.start()
    return thread


def die_with_parent(sig: int = signal.SIGKILL) -> str:
    """Make this process end when its parent does (a worker calls this first thing). Returns how:
    'prctl', 'watchdog', or 'orphaned' when the parent died during this call (then `sig` is on its way).
    A parent that died before this call is not seen (the process was already re-parented): call it
    before slow imports."""
    parent = os.getppid()
    how = "prctl" if set_parent_death_signal(sig) else "watchdog"
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
        return "orphaned"
    if how == "watchdog":
        start_parent_watchdog(parent, sig)
    return how
