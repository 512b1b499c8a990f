"""The host-wide registry of running moelab runs: one file per run in a per-user folder
(`registry_root()`), holding the run's pid, host and start time, and flock-ed by the registering process for
as long as it runs. An entry whose lock is free (the process died without cleaning up) is stale and
ignored. Each start and end is also appended to `history.jsonl` there, so a run that started and ended
inside another's job is still seen (moelab.health.contention asks it)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any


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
