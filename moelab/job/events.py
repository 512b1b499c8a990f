"""Progress events of one backend job, appended by the writing rank to RUN_DIR/BACKEND/progress.jsonl.

The launching process tails this file to show which case is running (moelab/launch/progress.py), and
ingest sums its one-time costs per job. One JSON object per line, written with a single write() and
flushed, so a reader never sees half an event except the line being written (which it skips until whole):

    {"event": "setup", "what": "communicator", "seconds": 0.8, "t": 1763856000.1}
    {"event": "case_start", "case_id": "…", "op": null, "t": …}       a case begins
    {"event": "case_start", "case_id": "…", "op": "dispatch", "t": …} the same case moves on to an op
    {"event": "case_end", "case_id": "…", "status": "ok", "seconds": 1.9, "t": …}

`setup` events carry the one-time costs of a job (library JIT/compilation, buffer creation, communicator
creation), timed apart from every measurement; one `what` may appear several times (a buffer rebuilt for
a larger case) and its seconds add up.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from moelab.job.safe_read import RunDirFileError, open_plain

SetupKind = Literal["jit", "buffers", "communicator"]
SETUP_KINDS: tuple[str, ...] = ("jit", "buffers", "communicator")
PROGRESS_FILE = "progress.jsonl"
MAX_EVENTS_READ = 64 << 20  # per read: a job writes a few lines per case


class ProgressEvents:
    """Appends progress events to a job's progress.jsonl; a disabled writer (ranks other than the
    writing one) accepts every call and writes nothing, so call sites need no rank checks."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._case_t0: dict[str, float] = {}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_job(cls, job_dir: Path, enabled: bool = True) -> ProgressEvents:
        return cls(job_dir / PROGRESS_FILE if enabled else None)

    def _emit(self, event: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = json.dumps(event | {"t": time.time()}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def setup(self, what: SetupKind, seconds: float) -> None:
        self._emit({"event": "setup", "what": what, "seconds": float(seconds)})

    @contextmanager
    def timed_setup(self, what: SetupKind) -> Iterator[None]:
        """Time a one-time cost: `with events.timed_setup("communicator"): init_process_group(...)`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.setup(what, time.perf_counter() - t0)

    def case_start(self, case_id: str, op: str | None = None) -> None:
        """A case begins (op None), or the running case moves on to `op` (check, dispatch, combine, …)."""
        if op is None:
            self._case_t0[case_id] = time.perf_counter()
        self._emit({"event": "case_start", "case_id": case_id, "op": op})

    def case_end(self, case_id: str, status: str) -> None:
        t0 = self._case_t0.pop(case_id, None)
        seconds = time.perf_counter() - t0 if t0 is not None else None
        self._emit({"event": "case_end", "case_id": case_id, "status": status, "seconds": seconds})


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Whole events appended to `path` since byte `offset`, and the offset to read from next time.
    A line still being written (no newline yet) is left for the next read; a garbled line is skipped."""
    try:
        fd = open_plain(path)  # a link is not followed, a FIFO not waited on
    except RunDirFileError:
        return [], offset
    if fd is None:
        return [], offset
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        data = fh.read(MAX_EVENTS_READ)
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, offset + end


def _progress_path(job_dir_or_file: Path) -> Path:
    return job_dir_or_file if job_dir_or_file.suffix == ".jsonl" else job_dir_or_file / PROGRESS_FILE


def one_time_costs(job_dir_or_file: Path) -> dict[str, float]:
    """Seconds per one-time cost (jit, buffers, communicator) of one job, summed over its setup events;
    empty when the job wrote none. This is what ingest stores per job."""
    events, _ = read_events(_progress_path(job_dir_or_file))
    costs: dict[str, float] = {}
    for e in events:
        if e.get("event") == "setup" and isinstance(e.get("seconds"), (int, float)):
            what = str(e.get("what", "other"))
            costs[what] = costs.get(what, 0.0) + float(e["seconds"])
    return costs
