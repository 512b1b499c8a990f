"""The console's view of a running backend job, from the events its writing rank appends to
RUN_DIR/BACKEND/progress.jsonl (moelab/job/events.py).

    with watch_job(files.dir, num_cases, world, device, quiet) as watch:
        outcome = run_job(...)
    watch.state.setup_s      # one-time costs seen (JIT, buffers, communicator), seconds

On a terminal: a live bar (case and op running, on how many ranks, cases done/total, elapsed, an
estimate). Not on a terminal (CI logs, pipes): one plain line per finished case and per one-time cost.
Under quiet: nothing. The file, not the console, is the record: `moelab.job.events.one_time_costs(job_dir)` reads it again
for ingest, so a run recovered after its launcher died keeps its one-time costs too.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn

from moelab.core.display import safe_text
from moelab.core.terminal import terminal_console
from moelab.job.events import PROGRESS_FILE, read_events
from moelab.plan.case_list import NOT_RUN

POLL_S = 0.25


def fmt_seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s"


NOT_MEASURED = ("unsupported", "skipped")


@dataclass
class JobProgress:
    """What the events of one job say so far; `apply` folds one event in.

    `kinds` maps each case id to what it will cost (moelab.plan.case_list.planned_kind: its case kind, or
    NOT_RUN for a case the plan knows will be skipped or unsupported): the estimate holds the cases left
    against the finished cases of their own kind, so one slow measured case does not make four
    unsupported ones look like minutes."""

    num_cases: int
    kinds: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    done: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    case_id: str | None = None
    op: str | None = None
    case_started: float | None = None
    case_seconds: list[float] = field(default_factory=list)
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # seconds of the finished cases per kind
    finished: set[str] = field(default_factory=set)
    setup_s: dict[str, float] = field(default_factory=dict)

    def apply(self, event: dict[str, Any]) -> None:
        kind, t = event.get("event"), event.get("t")
        if kind == "setup":
            what = str(event.get("what", "other"))
            self.setup_s[what] = self.setup_s.get(what, 0.0) + float(event.get("seconds") or 0.0)
        elif kind == "case_start":
            if event.get("case_id") != self.case_id or event.get("op") is None:
                self.case_id = event.get("case_id")
                self.case_started = float(t) if isinstance(t, (int, float)) else time.time()
            self.op = event.get("op")
        elif kind == "case_end":
            self.done += 1
            self.statuses[str(event.get("status"))] += 1
            seconds = event.get("seconds")
            if not isinstance(seconds, (int, float)) and self.case_started is not None and t is not None:
                seconds = float(t) - self.case_started
            case_id = str(event.get("case_id"))
            if isinstance(seconds, (int, float)):
                self.case_seconds.append(float(seconds))
                kind = NOT_RUN if event.get("status") in NOT_MEASURED else self.kinds.get(case_id, "case")
                self.by_kind.setdefault(kind, []).append(float(seconds))
            self.finished.add(case_id)
            self.case_id, self.op, self.case_started = None, None, None

    def elapsed(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - self.started

    def _expected(self, kind: str) -> float | None:
        """Seconds a case of `kind` takes: the mean of the finished ones of that kind; a case the plan
        knows will not run, none; a kind not seen yet, the mean of the measured cases so far."""
        seen = self.by_kind.get(kind)
        if seen:
            return sum(seen) / len(seen)
        if kind == NOT_RUN:
            return 0.0
        measured = [t for k, ts in self.by_kind.items() if k != NOT_RUN for t in ts]
        return sum(measured) / len(measured) if measured else None

    def estimate_left(self, now: float | None = None) -> float | None:
        """Seconds until the job ends, each case left held against the finished cases of its own kind;
        None before the first case ends (the first also pays JIT and warm-up, so the estimate settles
        after it)."""
        if not self.case_seconds:
            return None
        left = [k for cid, k in self.kinds.items() if cid not in self.finished and cid != self.case_id]
        unknown = max(self.num_cases - self.done - len(left) - (self.case_id is not None), 0)
        left += ["case"] * unknown  # cases the plan named no kind for
        expected = [self._expected(k) for k in left]
        running = self._expected(self.kinds.get(self.case_id, "case")) if self.case_id is not None else 0.0
        if running is None or any(e is None for e in expected):
            return None
        if self.case_started is not None and self.case_id is not None:
            elapsed = (now if now is not None else time.time()) - self.case_started
            running = max(running - elapsed, 0.0)
        return max(sum(e for e in expected if e is not None) + running, 0.0)


class JobWatch:
    """Tails one job's progress file on a thread and renders it; see watch_job."""

    def __init__(
        self,
        job_dir: Path,
        num_cases: int,
        world: int,
        device: str,
        quiet: bool,
        console: Console,
        kinds: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.path = job_dir / PROGRESS_FILE
        self.backend = name or job_dir.name  # a repeated start's folder is r<K>: the caller names the job
        self.ranks = f"{world} {device} rank{'s' if world != 1 else ''}"
        self.state = JobProgress(num_cases=num_cases, kinds=dict(kinds or {}))
        self.quiet = quiet
        self.console = console
        self._offset = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    # -- rendering ------------------------------------------------------------------------------------
    def _eta(self) -> str:
        left = self.state.estimate_left()
        return "estimating…" if left is None else f"about {fmt_seconds(left)} left"

    def _running(self) -> str:
        if self.state.done >= self.state.num_cases:
            return f"done on {self.ranks}"
        if self.state.case_id is None:
            return f"starting on {self.ranks}" if self.state.done == 0 else f"between cases on {self.ranks}"
        op = f" · {self.state.op}" if self.state.op else ""
        return f"{self.state.case_id}{op} · {self.ranks}"

    def _line(self, event: dict[str, Any]) -> str | None:
        kind = event.get("event")
        if kind == "setup":
            return f"[{self.backend}] one-time {event.get('what')}: {fmt_seconds(float(event.get('seconds') or 0))}"
        if kind == "case_end":
            took = self.state.case_seconds[-1] if self.state.case_seconds else None
            took_s = f" in {fmt_seconds(took)}" if took is not None else ""
            return (
                f"[{self.backend}] case {self.state.done}/{self.state.num_cases} {event.get('case_id')}: "
                f"{event.get('status')}{took_s} on {self.ranks} · elapsed {fmt_seconds(self.state.elapsed())}"
                f" · {self._eta()}"
            )
        return None

    def _refresh_bar(self) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task,
                completed=self.state.done,
                running=self._running(),
                elapsed=fmt_seconds(self.state.elapsed()),
                eta=self._eta(),
            )

    def poll(self) -> None:
        """Fold in and show the events appended since the last poll."""
        events, self._offset = read_events(self.path, self._offset)
        for event in events:
            self.state.apply(event)
            if self.quiet:
                continue
            line = safe_text(self._line(event) or "") or None  # a rank's event text may hold ESC/OSC bytes
            if self._bar is not None:
                if event.get("event") == "setup" and line:
                    self._bar.console.print(line)
            elif line:
                self.console.print(line)
        self._refresh_bar()

    # -- lifetime -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def start(self) -> None:
        if not self.quiet and self.console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn(f"[{self.backend}]", markup=False),
                TextColumn("{task.fields[running]}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[elapsed]} · {task.fields[eta]}", markup=False),
                console=self.console,
            )
            self._task = self._bar.add_task(
                self.backend,
                total=self.state.num_cases,
                running=self._running(),
                elapsed="0 s",
                eta=self._eta(),
            )
            self._bar.start()
        self._thread = threading.Thread(
            target=self._loop, name=f"moelab-progress-{self.backend}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        if self._bar is not None:
            self._bar.stop()
        if not self.quiet and self.state.setup_s:
            parts = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in sorted(self.state.setup_s.items()))
            self.console.print(
                safe_text(f"[{self.backend}] one-time costs (not in any measurement): {parts}")
            )


@contextmanager
def watch_job(
    job_dir: Path,
    num_cases: int,
    world: int,
    device: str,
    quiet: bool,
    console: Console | None = None,
    kinds: dict[str, str] | None = None,
    name: str | None = None,
) -> Iterator[JobWatch]:
    """Show a backend job's progress while the body (the launched job) runs; yields the watch, whose
    `state.setup_s` holds the job's one-time costs once the body is done. `kinds`: each case's planned
    kind, for the estimate (JobProgress)."""
    watch = JobWatch(
        job_dir,
        num_cases,
        world,
        device,
        quiet,
        console or terminal_console(),
        kinds,
        name,
    )
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()
