"""Where each case's median stepped over the store's history (`moelab check --history`): the run where a
new level starts, the levels before and after, and what changed there (the commit, the driver, CUDA, NCCL,
torch or library versions), by moelab.core.steps (ruptures' binary segmentation, the detector the history
report uses).

A series is one backend, case and op on one kind of hardware (GPU model x world): a history that spans
several is split by hardware, said in one line, and no step is ever placed across two. A series with a
NaN, missing or non-positive median is refused, in one line naming the runs. Runs on that hardware that
lack the case between its first and last point (gaps) are named in one line; the steps are placed among
the runs that have it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from moelab.core import steps as step_detect
from moelab.store.noise_history import SeriesPoint


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    backend: str
    case_id: str
    op: str
    hardware: str
    run_id: str  # the first run at the new level
    previous_run: str  # the last run at the old one
    index: int  # position of run_id among the series' runs
    before_us: float
    after_us: float
    changed: str  # what differs between the two runs: commit, software; "" when nothing recorded did

    @property
    def change(self) -> float:
        return self.after_us / self.before_us - 1.0


@dataclass(kw_only=True, slots=True)
class HistoryChanges:
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each: splits, refusals, gaps
    series: int = 0  # series segmented


def _what_changed(a: SeriesPoint, b: SeriesPoint) -> str:
    parts = []
    if a.git_sha != b.git_sha:
        parts.append(f"commit {a.git_sha or '?'} -> {b.git_sha or '?'}")
    if a.software != b.software:
        old = dict(p.split(" ", 1) for p in a.software.split(", ", 4))
        new = dict(p.split(" ", 1) for p in b.software.split(", ", 4))
        parts += [f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v]
    return "; ".join(parts)


def _bad(points: Sequence[SeriesPoint]) -> list[str]:
    return [
        p.run_id for p in points if p.median_us is None or not math.isfinite(p.median_us) or p.median_us <= 0
    ]


def find_changes(points: Sequence[SeriesPoint], min_effect: float = step_detect.MIN_EFFECT) -> HistoryChanges:
    """Steps of every series in `points` (oldest first within each series, as noise_history.series gives)."""
    out = HistoryChanges()
    runs_on: dict[str, set[tuple[object, str]]] = defaultdict(set)  # hardware -> (created, run) of its runs
    for p in points:
        runs_on[p.hardware].add((p.created_at, p.run_id))
    order = {hw: {r: i for i, (_t, r) in enumerate(sorted(runs))} for hw, runs in runs_on.items()}
    by_series: dict[tuple[str, str, str], list[SeriesPoint]] = defaultdict(list)
    for p in points:
        by_series[(p.backend, p.case_id, p.op)].append(p)
    for (backend, case_id, op), pts in by_series.items():
        name = f"{backend} {case_id} {op}"
        hardware = list(dict.fromkeys(p.hardware for p in pts))
        if len(hardware) > 1:
            counts = ", ".join(f"{hw} ({sum(p.hardware == hw for p in pts)} runs)" for hw in hardware)
            out.notes.append(f"{name}: history split by hardware, each judged alone: {counts}")
        for hw in hardware:
            series = [p for p in pts if p.hardware == hw]
            where = f"{name} on {hw}" if len(hardware) > 1 else name
            bad = _bad(series)
            if bad:
                out.notes.append(
                    f"{where}: refused: {len(bad)} NaN, missing or non-positive medians (runs {', '.join(bad[:5])}"
                    + (" ..." if len(bad) > 5 else "")
                    + ")"
                )
                continue
            pos = [order[hw][p.run_id] for p in series]
            gaps = (pos[-1] - pos[0] + 1) - len(set(pos)) if pos else 0
            if gaps:
                out.notes.append(
                    f"{where}: {gaps} runs on this hardware between its first and last lack it (gaps); "
                    f"steps are placed among the {len(series)} runs that have it"
                )
            out.series += 1
            medians = np.array([p.median_us for p in series], dtype=np.float64)
            for st in step_detect.detect_steps(medians, min_effect=min_effect):
                a, b = series[st.index - 1], series[st.index]
                out.changes.append(
                    Change(
                        backend=backend,
                        case_id=case_id,
                        op=op,
                        hardware=hw,
                        run_id=b.run_id,
                        previous_run=a.run_id,
                        index=st.index,
                        before_us=st.before,
                        after_us=st.after,
                        changed=_what_changed(a, b),
                    )
                )
    return out
