"""The starts of one backend job (--repeat N) merged into the one record per case that the store's `cases`
and `results` keep; each start's own figures stay beside it (ProcessOp: table `process_results`).

- Status: a case is measured only when every start measured it; otherwise it takes the status of the first
  start that did not, its reason naming that start (a case unsupported in every start stays as it is).
- Per op: `median_us` is the median of the per-process medians, with their bootstrap interval and the CV
  between them (moelab.core.intervals); n, percentiles, min/max, mean and the rank spread are over every
  start's iterations pooled; `noise` is the widest of the starts' own (within-process) noise; `stability`
  names each start whose median was not to be trusted. Bandwidths are over the merged median; kernel-only
  and library figures are those of the median start (the one whose median is nearest the merged median).
- Metrics (the e2e layer's): each the median over the starts that gave a finite value.

One start (the default) is returned as it is: a run without --repeat stores exactly what it stored before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from moelab.core.bandwidth import bandwidths
from moelab.core.case_record import CaseRecord, Metric, OpResult
from moelab.core.definitions import DEFINITIONS
from moelab.core.intervals import median_interval, median_of_medians, process_cv
from moelab.core.rows import RankRows
from moelab.core.stats import summarize

TIME_DEFINITIONS = frozenset(d.name for d in DEFINITIONS.values() if d.source == "time")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessOp:
    """One op as one start of the job measured it: a row of `process_results`."""

    repeat: int  # 0 for the first start
    op: str
    n: int
    median_us: float  # of the slowest rank's iteration times, as everywhere
    fastest_median_us: float | None  # of the fastest rank's iteration times
    noise: float | None  # the start's own noise of its median (within the process)
    rel_iqr: float | None
    stability: str | None


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def fastest_rank_median(samples_us: Sequence[Sequence[float]]) -> float | None:
    """The median over iterations of the fastest rank's time (None for ranks of unequal counts)."""
    try:
        arr = np.asarray(samples_us, dtype=np.float64)
    except ValueError:
        return None
    if arr.ndim != 2 or arr.size == 0:
        return None
    return float(np.median(arr.min(axis=0)))


def process_ops(repeat: int, rec: CaseRecord) -> list[ProcessOp]:
    """The per-start rows of a measured record."""
    return [
        ProcessOp(
            repeat=repeat,
            op=o.op,
            n=o.summary.n,
            median_us=o.summary.median_us,
            fastest_median_us=fastest_rank_median(o.samples_us),
            noise=_finite(o.summary.noise),
            rel_iqr=_finite(o.summary.rel_iqr),
            stability=o.stability,
        )
        for o in rec.ops
    ]


def _pooled(ops: Sequence[OpResult]) -> list[list[float]]:
    """Every start's iterations, rank by rank (ranks trimmed to a common count where they differ)."""
    ranks = min(len(o.samples_us) for o in ops)
    pooled = [[t for o in ops for t in o.samples_us[r]] for r in range(ranks)]
    shortest = min(len(r) for r in pooled)
    return [r[:shortest] for r in pooled]


def merge_op(ops: Sequence[OpResult], rows: Sequence[RankRows]) -> OpResult:
    """One op over its starts (module docstring)."""
    medians = [o.summary.median_us for o in ops]
    merged = median_of_medians(medians)
    ci = median_interval(medians)
    noises = [n for n in (_finite(o.summary.noise) for o in ops) if n is not None]
    pooled = _pooled(ops)
    summary = replace(
        summarize(pooled),
        median_us=merged,
        noise=max(noises) if noises else None,
        repeats=len(ops),
        ci_low_us=ci.low if ci else None,
        ci_high_us=ci.high if ci else None,
        process_cv=process_cv(medians),
    )
    mid = min(ops, key=lambda o: abs(o.summary.median_us - merged))
    figures = list(bandwidths(rows, mid.bytes_per_row, merged)) if rows and mid.bytes_per_row else []
    figures += [f for f in mid.figures if f.definition not in TIME_DEFINITIONS]
    unstable = [f"start {k + 1}: {o.stability}" for k, o in enumerate(ops) if o.stability]
    return replace(
        mid,
        samples_us=tuple(tuple(r) for r in pooled),
        summary=summary,
        figures=tuple(figures),
        stability="; ".join(unstable) or None,
    )


def _merge_metrics(records: Sequence[CaseRecord]) -> tuple[Metric, ...]:
    out = []
    for m in records[0].metrics:
        values = [
            x.value
            for r in records
            for x in r.metrics
            if x.name == m.name and x.value is not None and math.isfinite(x.value)
        ]
        out.append(replace(m, value=float(np.median(values)) if values else None))
    return tuple(out)


def _not_measured(records: Sequence[CaseRecord]) -> CaseRecord | None:
    """The record a case takes when some start did not measure it, or None when every start did."""
    k, bad = next(((k, r) for k, r in enumerate(records) if r.status != "ok"), (None, None))
    if bad is None or k is None:
        return None
    if all(r.status == bad.status and r.reason == bad.reason for r in records):
        return bad  # the same in every start (unsupported, skipped): nothing to say about starts
    return replace(bad, reason=f"start {k + 1} of {len(records)}: {bad.reason or bad.status}"[:2000])


def merge_starts(records: Sequence[CaseRecord]) -> CaseRecord:
    """The record of one case over the starts that ran it (the first start's record when there is one)."""
    if len(records) == 1:
        return records[0]
    bad = _not_measured(records)
    if bad is not None:
        return bad
    first = records[0]
    names = [o.op for o in first.ops if all(r.op(o.op) is not None for r in records)]
    ops = tuple(merge_op([r.op(n) for r in records], first.rows) for n in names)  # type: ignore[misc]
    suspects = list(dict.fromkeys(r.suspect_reason for r in records if r.suspect_reason))
    return replace(
        first,
        ops=ops,
        metrics=_merge_metrics(records),
        traces=tuple(t for r in records for t in r.traces),
        suspect_reason="; ".join(suspects) or None,
    )
