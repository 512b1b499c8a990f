"""Intervals from process samples: each start of a backend job (--repeat) is one sample, its median one
value. The variance that decides "is it slower" lies between processes (the GPU clocks it got, where the
allocator put its buffers, the mode a host-synchronising op settled in), so an interval over iterations of
one process is far too narrow; these are over processes.

How they are formed (AWS's fair EP comparison does the same): a percentile bootstrap of the median of the
per-process medians, 20,000 resamples, 95%, a fixed seed so every output is reproducible
(scipy.stats.bootstrap). With 3 processes it is crude: a resample's median is one of the three values,
so the interval is [smallest, largest] of them; it narrows with more processes. A ratio (candidate over
baseline, or one backend over another) is bootstrapped the same way: paired by start index where the two
sides ran in the same rotation of the same run, independently otherwise. Fewer than 2 processes on a side
give no interval (None): one process says nothing about the variation between processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RESAMPLES = 20_000
CONFIDENCE = 0.95
SEED = 29  # fixed: the same store gives the same intervals every time
METHOD = "percentile"


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self, fmt: str = ".3g") -> str:
        return f"[{self.low:{fmt}}, {self.high:{fmt}}]"


def _values(xs: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(xs, dtype=np.float64).reshape(-1)


def median_of_medians(medians: Sequence[float] | np.ndarray) -> float:
    return float(np.median(_values(medians)))


def process_cv(medians: Sequence[float] | np.ndarray) -> float | None:
    """Coefficient of variation of the per-process medians (sample standard deviation over the mean); None
    below two processes."""
    x = _values(medians)
    if x.size < 2 or not np.all(np.isfinite(x)) or x.mean() <= 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Any, paired: bool) -> Interval:
    from scipy import stats

    kwargs: dict[str, Any] = dict(
        n_resamples=RESAMPLES, confidence_level=CONFIDENCE, method=METHOD, vectorized=True, paired=paired
    )
    try:
        res = stats.bootstrap(data, statistic, rng=np.random.default_rng(SEED), **kwargs)
    except TypeError:  # scipy before 1.15 names the generator random_state
        res = stats.bootstrap(data, statistic, random_state=np.random.default_rng(SEED), **kwargs)
    ci = res.confidence_interval
    return Interval(float(ci.low), float(ci.high))


def _within(ci: Interval, values: np.ndarray, point: float) -> Interval:
    """The interval clipped to the values' range and widened to hold its own point: a median of resampled
    values can leave neither, but the bootstrap's interpolation can, by a rounding step (seen both ways)."""
    lo, hi = float(values.min()), float(values.max())
    low = min(max(ci.low, lo), point)
    high = max(min(ci.high, hi), point)
    return Interval(low, high)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis)


def _ratio(base: np.ndarray, cand: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(cand, axis=axis) / np.median(base, axis=axis)


def _paired_ratio(base: np.ndarray, cand: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(cand / base, axis=axis)


def interleaved_ratio_interval(
    base: Sequence[float] | np.ndarray, cand: Sequence[float] | np.ndarray
) -> Interval | None:
    """The bootstrap interval of median(cand) / median(base) for two ops timed interleaved (iteration k of
    each ran side by side: moelab.measure.timing.Clock.sample_interleaved), resampling the iteration pairs
    together so what moved both (clocks, power, the communicator) cancels; the point is the ratio of the
    medians, as the stored metric is. None below two pairs or where the sides differ in length."""
    b, c = _values(base), _values(cand)
    if b.size < 2 or b.size != c.size or not (np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        return None
    if np.any(b <= 0):
        return None
    point = float(np.median(c) / np.median(b))
    if np.all(c / b == c[0] / b[0]):
        return Interval(point, point)
    return _within(_bootstrap((b, c), _ratio, paired=True), c / b, point)


def ratio_point(
    base: Sequence[float] | np.ndarray, cand: Sequence[float] | np.ndarray, paired: bool = False
) -> float:
    """The ratio the interval is of: the median of the per-start ratios when paired (what a shared start
    condition moved cancels), else the ratio of the medians of the per-process medians."""
    b, c = _values(base), _values(cand)
    if paired and b.size == c.size:
        return float(np.median(c / b))
    return float(np.median(c) / np.median(b))


def median_interval(medians: Sequence[float] | np.ndarray) -> Interval | None:
    """The bootstrap interval of the median of the per-process medians; None below two processes."""
    x = _values(medians)
    if x.size < 2 or not np.all(np.isfinite(x)):
        return None
    if np.all(x == x[0]):
        return Interval(float(x[0]), float(x[0]))
    return _within(_bootstrap((x,), _median, paired=False), x, float(np.median(x)))


def ratio_interval(
    base: Sequence[float] | np.ndarray, cand: Sequence[float] | np.ndarray, paired: bool = False
) -> Interval | None:
    """The bootstrap interval of cand over base (ratio_point) from per-process medians (`paired`: resample
    the pairs (base[k], cand[k]) together); None when a side has fewer than two processes."""
    b, c = _values(base), _values(cand)
    if b.size < 2 or c.size < 2 or not (np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        return None
    if np.any(b <= 0):
        return None
    if paired and b.size != c.size:
        paired = False
    if np.all(b == b[0]) and np.all(c == c[0]):
        r = float(c[0] / b[0])
        return Interval(r, r)
    if paired:
        return _within(_bootstrap((b, c), _paired_ratio, paired=True), c / b, float(np.median(c / b)))
    return _bootstrap((b, c), _ratio, paired=False)
