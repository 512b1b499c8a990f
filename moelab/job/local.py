"""Run one backend job on this host under torchrun, and survive it crashing or hanging.

What we rely on:
- torchrun (torch.distributed.run) with --max-restarts 0: when one rank exits non-zero or by a signal,
  its agent stops the other ranks and exits non-zero, naming the failed rank and its exit code/signal.
- init_process_group(timeout=...) in the worker: a rank waiting in a collective for a peer that never
  comes raises after that timeout (gloo, and NCCL with async error handling, torch's default).
- an outer wall-clock timeout here: the job runs in its own process session, and on timeout the whole
  group (agent and ranks) gets SIGTERM, then SIGKILL; before that the ranks get SIGUSR1, on which
  faulthandler writes every thread's stack (moelab.job.diagnosis). That also covers hangs inside custom kernels,
  which no collective timeout sees.
- a parent-death signal (moelab/job/lifeline.py): if this process is killed without warning, the job's
  leader gets SIGTERM and its ranks follow, so no job outlives the run that started it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moelab.job.diagnosis import request_stack_dumps, with_descendants
from moelab.job.lifeline import job_preexec, subreaper
from moelab.job.rundir import JobFiles, now_iso
from moelab.job.safe_read import read_tail

TERM_GRACE_S = 1.5  # after SIGTERM, before SIGKILL


@dataclass(kw_only=True, slots=True)
class JobOutcome:
    backend: str
    argv: list[str]
    returncode: int | None
    signal: str | None
    timed_out: bool
    duration_s: float
    started_at: str
    failed_ranks: list[dict[str, Any]] = field(default_factory=list)
    stderr_tails: dict[int, str] = field(default_factory=dict)
    leftover_pids: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        if self.timed_out:
            return f"timed out after {self.duration_s:.0f} s; job killed"
        if self.ok:
            return "ok"
        parts = [f"exit code {self.returncode}"]
        for fr in self.failed_ranks:
            code = fr.get("exitcode")
            sig = fr.get("signal")
            parts.append(f"rank {fr.get('rank')}: {sig or f'exit code {code}'}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"description": self.describe()}


_FAILURE_RE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def parse_torchrun_failures(text: str) -> list[dict[str, Any]]:
    """Failed ranks from torchrun's ChildFailedError summary ("rank : 1 (local_rank: 1) / exitcode : -11")."""
    out = []
    seen = set()
    for block in re.split(r"\[\d+\]:\s*\n|Root Cause|Failures:", text):
        for m in _FAILURE_RE.finditer(block):
            rank, code = int(m.group(1)), int(m.group(2))
            if (rank, code) in seen:
                continue
            seen.add((rank, code))
            sig = None
            if code < 0:
                try:
                    sig = signal.Signals(-code).name
                except ValueError:
                    sig = f"signal {-code}"
            out.append({"rank": rank, "exitcode": code, "signal": sig})
    return out


def _job_pids(before: set[int]) -> list[int]:
    """Every live process below this one that was not there before the job started: the job's leader, its
    ranks (each in a session of its own under torchrun) and anything they started, orphans included (this
    process is their subreaper)."""
    me = os.getpid()
    return [p for p in with_descendants([me]) if p != me and p not in before and not _is_zombie(p)]


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap(pids: list[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's children now (orphans it adopted)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def end_job(before: set[int], grace_s: float = TERM_GRACE_S) -> list[int]:
    """End every process the job left behind: SIGTERM, `grace_s` to go, then SIGKILL (which also ends a
    stopped one); returns the pids found alive."""
    left = _job_pids(before)
    if not left:
        return []
    _signal_all(left, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _job_pids(before):
        _reap(left)
        time.sleep(0.05)
    _signal_all(_job_pids(before), signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _job_pids(before):
        _reap(left)
        time.sleep(0.05)
    _reap(left)
    return left


def run_job(files: JobFiles, argv: list[str], timeout_s: float, env: dict[str, str]) -> JobOutcome:
    """Start `argv` in its own session, wait up to `timeout_s` (then each rank's stack, SIGTERM, SIGKILL:
    the job ends within a few seconds of it), and end every process the job left behind, recording them."""
    with subreaper():
        return _run_job(files, argv, timeout_s, env)


def _run_job(files: JobFiles, argv: list[str], timeout_s: float, env: dict[str, str]) -> JobOutcome:
    files.dir.mkdir(parents=True, exist_ok=True)
    before = set(with_descendants([os.getpid()]))
    started, t0 = now_iso(), time.monotonic()
    with files.launcher_log.open("w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=job_preexec(os.getpid()),  # the job dies with this process, even on kill -9
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            request_stack_dumps(_job_pids(before))  # each rank's Python stack, where it hung
            _signal_all(_job_pids(before), signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=TERM_GRACE_S)
            if proc.poll() is None:
                proc.kill()
        proc.wait()
    # what outlived the job's leader: ranks torchrun could not stop, processes a backend started (after a
    # timeout everything had its SIGTERM already: what is left gets SIGKILL at once)
    leftover = end_job(before, grace_s=0.2 if timed_out else TERM_GRACE_S)
    rc = proc.returncode
    text = (read_tail(files.launcher_log) or b"").decode(errors="replace")  # torchrun's summary is at its end
    outcome = JobOutcome(
        backend=files.backend,
        argv=argv,
        returncode=rc,
        signal=(signal.Signals(-rc).name if rc is not None and rc < 0 else None),
        timed_out=timed_out,
        duration_s=time.monotonic() - t0,
        started_at=started,
        failed_ranks=parse_torchrun_failures(text) if rc != 0 else [],
        stderr_tails=files.log_tails() if (rc != 0 or timed_out) else {},
        leftover_pids=leftover,
    )
    files.write_job(outcome.to_dict())
    return outcome
