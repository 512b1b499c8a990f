"""Was anything else using the machine while we measured? Other GPU processes, other moelab runs on this
host (moelab.health.run_registry), host load: sampled on a thread while a job runs (ContentionMonitor).

Contended numbers look normal (two runs at once: dispatch medians 168–232 ms against 88.5 ms alone), so
they are marked `suspect` with the reason, and the console and the report say so. A case whose spread is
far above a noise target or its own history is judged after ingest (moelab.health.spread).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moelab.health.run_registry import RunEntry, overlapping_runs, running_runs

LOAD_PER_CORE_LIMIT = 0.5  # other work than ours above half the cores: timings of CPU-bound steps suffer


@dataclass(frozen=True, slots=True)
class ContentionFinding:
    """One sign that the machine was shared: `kind` is gpu-process, moelab-run, host-load or spread."""

    kind: str
    subject: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ContentionFinding:
        return cls(kind=str(d["kind"]), subject=str(d["subject"]), reason=str(d["reason"]))


def run_findings(runs: Sequence[RunEntry]) -> list[ContentionFinding]:
    return [
        ContentionFinding(
            kind="moelab-run",
            subject=r.run_id,
            reason=f"another moelab run ({r.run_id}, pid {r.pid}) ran on {r.host} at the same time",
        )
        for r in runs
    ]


# --- other GPU processes, host load ---------------------------------------------------------------------


def gpu_process_findings(nvml: Any, own_pids: Sequence[int]) -> list[ContentionFinding]:
    """Compute processes on any GPU that are not ours (NVML; `nvml` is pynvml or a module-like object).
    Processes of other containers show with pid 0 or a foreign pid: they count too."""
    own = set(own_pids)
    out = []
    nvml.nvmlInit()
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            procs = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            with contextlib.suppress(AttributeError, Exception):
                procs += list(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
            others = sorted({int(p.pid) for p in procs} - own)
            if others:
                out.append(
                    ContentionFinding(
                        kind="gpu-process",
                        subject=f"GPU {index}",
                        reason=f"{len(others)} other process(es) on GPU {index} (pid {', '.join(map(str, others[:5]))})",
                    )
                )
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out


def load_findings(
    own_busy: int = 0,
    cores: int | None = None,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
) -> list[ContentionFinding]:
    """The 1-minute load beyond our own `own_busy` busy processes, against the host's cores."""
    cores = cores or os.cpu_count() or 1
    load1 = loadavg()[0]
    other = load1 - own_busy
    if other > LOAD_PER_CORE_LIMIT * cores:
        return [
            ContentionFinding(
                kind="host-load",
                subject=socket.gethostname(),
                reason=f"host load {load1:.1f} on {cores} cores ({other:.1f} beyond this run's {own_busy} ranks)",
            )
        ]
    return []


def _pynvml() -> Any | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return pynvml
    except Exception:  # not installed, no driver: no GPU findings
        return None


def check(
    run_id: str,
    own_pids: Sequence[int] = (),
    own_busy: int = 0,
    root: Path | None = None,
    nvml: Any | None = None,
) -> list[ContentionFinding]:
    """Everything that shares the machine with run `run_id` now."""
    found = run_findings(running_runs(root, exclude=run_id))
    nvml = nvml if nvml is not None else _pynvml()
    if nvml is not None:
        with contextlib.suppress(Exception):
            found += gpu_process_findings(nvml, own_pids)
    return found + load_findings(own_busy)


def our_processes(run_id: str) -> list[int]:
    """Processes whose GPU use is ours: this launcher and every process below it (torchrun's agent and
    ranks), and any process whose command line names the run (srun's ranks are children of slurmstepd,
    not of us; their arguments hold RUN_DIR, which ends in the run id). A rank inside a container whose
    pids NVML reports from another namespace cannot be matched and counts as another process."""
    from moelab.job.diagnosis import with_descendants

    own = set(with_descendants([os.getpid()]))
    needle = run_id.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in own:
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    own.add(int(entry.name))
    return sorted(own)


class ContentionMonitor:
    """Samples `check` every `interval_s` on a thread while a job runs (and once at start and end);
    `findings` holds each distinct finding once. Other runs that started and ended between samples are
    found from the registry's history."""

    def __init__(
        self,
        run_id: str,
        own_busy: int = 0,
        interval_s: float = 5.0,
        root: Path | None = None,
        own_pids: Callable[[], Sequence[int]] | None = None,
    ) -> None:
        self.run_id, self.own_busy, self.interval_s, self.root = run_id, own_busy, interval_s, root
        self.own_pids = own_pids or (lambda: our_processes(run_id))
        self.findings: list[ContentionFinding] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="moelab-contention", daemon=True)
        self._since = 0.0

    def _sample(self) -> None:
        for f in check(self.run_id, self.own_pids(), self.own_busy, self.root):
            if all((g.kind, g.subject) != (f.kind, f.subject) for g in self.findings):
                self.findings.append(f)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ContentionMonitor:
        self._since = time.time()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        seen = {f.subject for f in self.findings if f.kind == "moelab-run"}
        for f in run_findings(overlapping_runs(self._since, time.time(), self.root, exclude=self.run_id)):
            if f.subject not in seen:
                self.findings.append(f)


# --- what a job's findings say ---------------------------------------------------------------------------------


def suspect_reason(findings: Sequence[ContentionFinding]) -> str | None:
    """One line for `cases.suspect_reason`, or None when nothing shared the machine."""
    if not findings:
        return None
    return "; ".join(f"{f.kind}: {f.reason}" for f in findings)[:1000]


def job_suspect_reason(findings: Sequence[dict[str, Any]], health_reason: str | None = None) -> str | None:
    """The suspect reason of a job's measured cases: health worsening (`health_reason`, from ingest's
    health diff) and what shared the machine during the job (JobFiles.read_contention's findings)."""
    found = [ContentionFinding.from_dict(d) for d in findings]
    parts = [p for p in (health_reason, suspect_reason(found)) if p]
    return "; ".join(parts)[:1000] if parts else None
