"""Summaries of raw timing samples. Samples are [rank][iteration] in microseconds; an iteration's time
is its slowest rank's (the collective is as slow as its slowest member)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moelab.core.case_record import Summary

TimeSummary = Summary  # the record's type: one summary shape from the samples to the store


def iteration_times(samples: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError("samples must be a non-empty [rank][iteration] table")
    return arr.max(axis=0)


def summarize(samples: Sequence[Sequence[float]]) -> TimeSummary:
    arr = np.asarray(samples, dtype=np.float64)
    per_iter = iteration_times(arr)
    q = np.percentile(per_iter, [10, 25, 50, 75, 90, 99])
    median = float(q[2])
    return TimeSummary(
        n=int(per_iter.size),
        median_us=median,
        p10_us=float(q[0]),
        p90_us=float(q[4]),
        p99_us=float(q[5]),
        min_us=float(per_iter.min()),
        max_us=float(per_iter.max()),
        mean_us=float(per_iter.mean()),
        rank_spread_us=float(np.median(arr.max(axis=0) - arr.min(axis=0))),
        rel_iqr=float((q[3] - q[1]) / median) if median > 0 else float("nan"),
    )
