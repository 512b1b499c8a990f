"""The one ranking rule of `moelab run`'s summary, `moelab report` and `moelab compare`: which of two
backends (or runs) is faster, from the medians of their processes (each start of a job under --repeat).

A winner is named only where the 99% interval of the time ratio excludes 1: Student's t on the
logarithms of the per-process medians with their pooled variance. Starts of two backends in the same
rotation of one run are not paired for the interval (the point is): with 3 starts the paired test has 2
degrees of freedom and an interval too wide to rank anything, and treating them as independent only
widens it where the shared conditions moved both. Fewer than two processes a side give no interval, and no
interval is never a winner ("no interval": --repeat 3 to rank). Why not the 95% percentile bootstrap the
summary and compare used before: with 3 processes a side its interval of a ratio of medians is about as
wide as the values' range, and two runs of the same code came out "faster" or "slower" in 6-9% of
synthetic pairs; at 99% on the t interval it is at most 1% a side, so at least 97% of such pairs name no
winner (tests/reports/test_ranking_rule.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moelab.core.intervals import Interval, ratio_point

CONFIDENCE = 0.99
FASTER, SLOWER, INDISTINGUISHABLE, NO_INTERVAL = "faster", "slower", "indistinguishable", "no interval"
WINNERS = (FASTER, SLOWER)


@dataclass(frozen=True, kw_only=True, slots=True)
class PairRanking:
    """`other` against `ref`, in time (ratio = other / ref)."""

    ratio: float
    interval: Interval | None  # None: fewer than two processes a side
    verdict: str  # FASTER, SLOWER, INDISTINGUISHABLE or NO_INTERVAL

    @property
    def winner(self) -> bool:
        return self.verdict in WINNERS


def _t_quantile(df: int) -> float:
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + CONFIDENCE / 2))


def log_ratio_interval(
    ref: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray
) -> Interval | None:
    """The CONFIDENCE interval of other / ref from per-process medians; None below two a side."""
    a = np.log(np.asarray(ref, dtype=np.float64).reshape(-1))
    b = np.log(np.asarray(other, dtype=np.float64).reshape(-1))
    if a.size < 2 or b.size < 2 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    df = a.size + b.size - 2
    pooled = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / df
    centre, se = float(b.mean() - a.mean()), math.sqrt(pooled * (1 / a.size + 1 / b.size))
    if se == 0:
        return Interval(math.exp(centre), math.exp(centre))
    half = _t_quantile(df) * se
    return Interval(math.exp(centre - half), math.exp(centre + half))


def rank_pair(
    ref: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray, paired: bool = False
) -> PairRanking:
    ref_v, other_v = np.asarray(ref, dtype=np.float64), np.asarray(other, dtype=np.float64)
    paired = paired and ref_v.size == other_v.size
    point = ratio_point(ref_v, other_v, paired) if ref_v.size and other_v.size else float("nan")
    ci = log_ratio_interval(ref_v, other_v)
    if ci is None:
        verdict = NO_INTERVAL
    elif ci.covers(1.0):
        verdict = INDISTINGUISHABLE
    else:
        verdict = FASTER if ci.high < 1.0 else SLOWER
    return PairRanking(ratio=point, interval=ci, verdict=verdict)
