"""Was anything else using the machine while we measured? Other GPU processes, other moelab runs on this
host, host load; and cases whose spread is far above a noise target or their own history.

Contended numbers look normal (two runs at once: dispatch medians 168–232 ms against 88.5 ms alone), so
they are marked `suspect` with the reason, and the console and the report say so.

The registry of running runs: one file per run in a host-wide folder (`registry_root()`), holding the
run's pid, host and start time, and flock-ed by the registering process for as long as it runs. An entry
whose lock is free (the process died without cleaning up) is stale and ignored. Each start and end is also
appended to `history.jsonl` there, so a run that started and ended inside our job is still seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

LOAD_PER_CORE_LIMIT = 0.5  # other work than ours above half the cores: timings of CPU-bound steps suffer
NOISE_TARGET = 0.05  # IQR / median of a GPU case measured alone (nvbench's default stdrel is 0.5%)
FAR_ABOVE = 3.0  # a spread this many times the target, or the case's own history, is flagged
MIN_HISTORY = 3


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


# --- other moelab runs --------------------------------------------------------------------------------


def registry_root() -> Path:
    """A per-user folder in the system temp dir (XDG's runtime dir is often unset on compute nodes)."""
    return Path(tempfile.gettempdir()) / f"moelab-runs-{os.getuid()}"


@dataclass(frozen=True, slots=True)
class RunEntry:
    run_id: str
    pid: int
    host: str
    started: float  # time.time()
    ended: float | None = None


@dataclass(slots=True)
class Registration:
    """A run registered as running; `close()` (or leaving the `register` block) ends it."""

    root: Path
    entry: RunEntry
    _fh: IO[str] | None = field(default=None, repr=False)

    def close(self) -> None:
        if self._fh is None:
            return
        _append_history(self.root, {**asdict(self.entry), "ended": time.time()})
        with contextlib.suppress(OSError):
            _entry_path(self.root, self.entry.run_id, self.entry.pid).unlink()
        self._fh.close()  # releases the lock
        self._fh = None


def _entry_path(root: Path, run_id: str, pid: int) -> Path:
    return root / f"{run_id}.{pid}.run.json"  # the pid too: torchrun nodes of one run may share a host


HISTORY_MAX_BYTES = 1 << 20


def _append_history(root: Path, record: dict[str, Any]) -> None:
    """One line per start and end; past HISTORY_MAX_BYTES the older half is dropped (days-old runs
    overlap no job that is still being checked)."""
    with (root / "history.jsonl").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if fh.tell() > HISTORY_MAX_BYTES:
            fh.seek(0)
            lines = fh.readlines()
            fh.seek(0)
            fh.truncate()
            fh.writelines(lines[len(lines) // 2 :])
        fh.write(json.dumps(record) + "\n")


def start_registration(run_id: str, root: Path | None = None) -> Registration:
    root = root or registry_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = RunEntry(run_id=run_id, pid=os.getpid(), host=socket.gethostname(), started=time.time())
    path = _entry_path(root, run_id, entry.pid)
    fh = path.open("w")
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fh.write(json.dumps(asdict(entry)))
    fh.flush()
    _append_history(root, asdict(entry))
    return Registration(root=root, entry=entry, _fh=fh)


@contextlib.contextmanager
def register(run_id: str, root: Path | None = None) -> Iterator[Registration]:
    """Mark this run as running on this host for the duration of the block."""
    reg = start_registration(run_id, root)
    try:
        yield reg
    finally:
        reg.close()


def _is_held(path: Path) -> bool:
    """True while the registering process holds the entry's lock (it is alive and has not ended)."""
    try:
        with path.open() as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def running_runs(root: Path | None = None, exclude: str | None = None) -> list[RunEntry]:
    """Runs registered now whose process still holds its entry (stale entries are ignored)."""
    root = root or registry_root()
    out = []
    for path in sorted(root.glob("*.run.json")) if root.exists() else []:
        if not _is_held(path):
            continue
        try:
            entry = RunEntry(**json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, TypeError):
            continue
        if entry.run_id != exclude:
            out.append(entry)
    return out


def overlapping_runs(
    since: float, until: float, root: Path | None = None, exclude: str | None = None
) -> list[RunEntry]:
    """Other runs that ran at any moment in [since, until]: from the history (start and end records),
    plus runs still registered. A start without an end whose entry is stale counts up to its start."""
    root = root or registry_root()
    live = {e.run_id: e for e in running_runs(root, exclude)}
    starts: dict[str, RunEntry] = {}
    ends: dict[str, float] = {}
    history = root / "history.jsonl"
    for line in history.read_text().splitlines() if history.exists() else []:
        with contextlib.suppress(json.JSONDecodeError, TypeError, KeyError):
            rec = json.loads(line)
            if rec.get("ended") is not None:
                ends[rec["run_id"]] = float(rec["ended"])
            else:
                starts[rec["run_id"]] = RunEntry(**rec)
    out = []
    for run_id, entry in starts.items():
        if run_id == exclude:
            continue
        end = ends.get(run_id, until if run_id in live else entry.started)
        if entry.started <= until and end >= since:
            out.append(RunEntry(run_id, entry.pid, entry.host, entry.started, ends.get(run_id)))
    return out


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


# --- spread --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpreadFlag:
    backend: str
    case_id: str
    op: str
    rel_iqr: float
    reference: float  # the noise target or the history's median spread, whichever it was held against
    basis: str  # "target" or "history (N runs)"

    def reason(self) -> str:
        return (
            f"spread: {self.op} IQR/median {100 * self.rel_iqr:.1f}% is over {FAR_ABOVE:g}x its {self.basis} "
            f"({100 * self.reference:.1f}%)"
        )


def tool_timed_backends(con: Any, run_id: str) -> list[str]:
    """Backends of `run_id` whose results are their tool's own timing (host jobs, one figure per size, e.g.
    an external benchmark binary), which the judgements of moelab's samples here leave out."""
    from moelab.backends import registry  # the backend classes import torch: only when a run is judged

    stored = con.execute(
        "SELECT DISTINCT backend FROM results WHERE run_id = ? ORDER BY 1", [run_id]
    ).fetchall()
    return registry.host_jobs(r[0] for r in stored)


def spread_flags(
    con: Any,
    run_id: str,
    noise_target: float = NOISE_TARGET,
    far_above: float = FAR_ABOVE,
    devices: Sequence[str] = ("cuda",),
) -> list[SpreadFlag]:
    """Results of `run_id` whose IQR/median is more than `far_above` times the case's own history (median
    over earlier runs of the same backend, case and op on the same GPU model, at least MIN_HISTORY of
    them) or, without enough history, times `noise_target`. Only runs on `devices` (CPU timings over gloo
    are for function, not performance)."""
    device = con.execute("SELECT device FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if device is None or device[0] not in devices:
        return []
    rows = con.execute(
        """
        WITH gpu AS (SELECT run_id, backend, any_value(gpu_name) AS gpu_name FROM environment GROUP BY ALL),
        cur AS (
            SELECT r.backend, r.case_id, r.op, r.rel_iqr, g.gpu_name, ru.created_at
            FROM results r JOIN runs ru USING (run_id) LEFT JOIN gpu g USING (run_id, backend)
            WHERE r.run_id = ? AND r.rel_iqr IS NOT NULL AND NOT list_contains(?::VARCHAR[], r.backend))
        SELECT cur.backend, cur.case_id, cur.op, cur.rel_iqr,
               (SELECT list(h.rel_iqr) FROM results h JOIN runs hr USING (run_id) LEFT JOIN gpu hg USING (run_id, backend)
                WHERE h.backend = cur.backend AND h.case_id = cur.case_id AND h.op = cur.op AND h.run_id <> ?
                  AND hr.created_at < cur.created_at AND hr.device = ?
                  AND hg.gpu_name IS NOT DISTINCT FROM cur.gpu_name AND h.rel_iqr IS NOT NULL) AS history
        FROM cur ORDER BY cur.backend, cur.case_id, cur.op
        """,
        [run_id, tool_timed_backends(con, run_id), run_id, device[0]],
    ).fetchall()
    out = []
    for backend, case_id, op, rel_iqr, history in rows:
        past = [h for h in history or [] if h is not None]
        if len(past) >= MIN_HISTORY:
            reference, basis = statistics.median(past), f"history ({len(past)} runs)"
            reference = max(reference, noise_target / far_above)  # a near-zero history is not a bar
        else:
            reference, basis = noise_target, "noise target"
        if rel_iqr > far_above * reference:
            out.append(SpreadFlag(backend, case_id, op, float(rel_iqr), float(reference), basis))
    return out
