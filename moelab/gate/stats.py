"""Is a candidate's timing different from a baseline's? Tests on the raw per-iteration samples.

- Mann-Whitney U (two-sided) at p < 0.002, as asv does. It makes no assumption on the shape of the
  distribution (GPU timings are skewed, with a long right tail), and 0.002 keeps the false-positive rate
  per compared op at 0.2% or less, so a suite of a few hundred ops rarely raises a false alarm. It is
  used when the sample sizes can reach that p at all: the smallest two-sided exact p is 2 / C(n+m, n)
  (7 + 7 samples: 0.0006; 6 + 6: 0.0022).
- With fewer samples (an e2e layer op keeps 5 repetitions), the fallback is the order-
  statistic one: the two samples' ranges [min, max] must not overlap, every candidate iteration slower
  (or faster) than every baseline one. [min, max] is the widest order-statistic interval of each median;
  under no change the chance the two do not overlap is exactly 2 / C(n+m, n), the smallest Mann-Whitney
  p. The fallback is used only where that is at most 1% (5 + 5: 0.8%), a 99% test; below that (4 + 4:
  2.9%) the samples cannot tell and the test says so. A bootstrap interval is not used: with so few
  samples percentile-bootstrap intervals are too narrow and would raise false alarms.

With repeats (each start of a backend job one process sample) the test is on the per-process medians
instead: Student's t-test on their logarithms (a slowdown is a ratio; the pooled variance, since both
runs measure the same op on the same kind of machine), two-sided at p < 0.02: 1% a side, so a false
alarm of a regression stays at or under 1% however noisy the processes are (the 5% threshold beside it
only lowers it). benchmarks/gate_power.py shows it on synthetic histories with process noise, with the
power it leaves: +10% caught at least 95% of the time while the CV between processes is up to 1.5% with
3 starts a side, 2% with 5 (94.8% at 3%). (p < 0.05 would catch +10% up to a 2% CV with 3 starts, at up
to 2.5% false alarms once processes vary by 5% or more.) Mann-Whitney cannot serve there: its smallest p for 3
and 3 processes is 0.1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moelab.gate.mannwhitney import two_sided_p

Samples = Sequence[float] | np.ndarray

MWU_ALPHA = 0.002
EXACT_COMB_MAX = 2000  # sample counts up to which extreme_p forms C(n+m, n) exactly
FALLBACK_LEVEL = 0.01  # the disjoint-ranges test is used only where its false-positive rate is at most this
PROCESS_ALPHA = 0.02  # two-sided level of the t-test on per-process medians (see the module docstring)


@dataclass(frozen=True, kw_only=True, slots=True)
class Test:
    method: str  # "mann-whitney" | "disjoint-ranges" | "t-test" | "none"
    significant: bool | None  # None: too few samples to tell
    p_value: float | None = None  # for disjoint-ranges: the exact false-positive rate of the test


def extreme_p(n: int, m: int) -> float:
    """Smallest two-sided exact Mann-Whitney p for sample sizes n and m: P(ranges disjoint | no change).

    Integer division (correctly rounded, never an OverflowError as float / int was) while C(n+m, n) is
    cheap to form; past that log-gamma, whose answer there underflows to 0.0 anyway."""
    if n + m <= EXACT_COMB_MAX:
        return 2 / math.comb(n + m, n)
    log_comb = math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1)
    return min(1.0, 2.0 * math.exp(-log_comb))


def differ(
    base: Samples, cand: Samples, alpha: float = MWU_ALPHA, fallback_level: float = FALLBACK_LEVEL
) -> Test:
    a = np.asarray(base, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        return Test(method="none", significant=None)
    floor = extreme_p(a.size, b.size)
    if floor < alpha:
        if np.all(a == a[0]) and np.all(b == b[0]):  # constant samples: U is undefined, the answer is not
            return Test(
                method="mann-whitney", significant=bool(a[0] != b[0]), p_value=0.0 if a[0] != b[0] else 1.0
            )
        p = two_sided_p(a, b)
        return Test(method="mann-whitney", significant=p < alpha, p_value=p)
    if floor <= fallback_level:
        disjoint = bool(a.max() < b.min() or b.max() < a.min())
        return Test(method="disjoint-ranges", significant=disjoint, p_value=floor)
    return Test(method="none", significant=None)


def processes_differ(base: Samples, cand: Samples, alpha: float = PROCESS_ALPHA) -> Test:
    """Student's t-test (pooled variance, two-sided) on the logarithms of the per-process medians."""
    a = np.log(np.asarray(base, dtype=np.float64))
    b = np.log(np.asarray(cand, dtype=np.float64))
    df = a.size + b.size - 2
    if a.size < 2 or b.size < 2:
        return Test(method="none", significant=None)
    pooled = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / df
    diff = float(b.mean() - a.mean())
    if pooled <= 0:  # every process gave the same median on each side: the answer is the difference
        return Test(method="t-test", significant=diff != 0, p_value=0.0 if diff != 0 else 1.0)
    from scipy.special import stdtr

    t = diff / math.sqrt(pooled * (1 / a.size + 1 / b.size))
    p = float(2 * stdtr(df, -abs(t)))
    return Test(method="t-test", significant=p < alpha, p_value=p)
