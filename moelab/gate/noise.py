"""How much an op's median moves between processes, and the decision that uses it.

One rule could not serve every op: on 2xH200 the between-process CV was at most 0.2% for kernel-bound ops
(cached dispatch, combine, pair) and 5-24% for ops with a host sync inside (layout, dispatch_fresh,
roundtrip), and a test that ignores the between-process spread (per-iteration Mann-Whitney at repeat 1)
false-alarmed 4-34%. So each case and op gets its own noise: the spread of the logarithms of the
per-process medians of earlier runs of the same case on the same hardware and software (the store's
history), pooled with the spread between the two runs' own starts (--repeat). Without history a prior per
op class stands in (PRIOR_CV), held as known.

The decision on d = mean log(candidate process medians) - mean log(baseline's), with standard error
se = sigma * sqrt(1/n_base + 1/n_cand):

- significant when |d| > crit * se, crit the one-sided 1 - ALPHA quantile (Student's t on the noise's
  degrees of freedom, normal for a prior): a false alarm in either direction is at most ALPHA;
- a significant slowdown is a **regression** unless it is confidently below the threshold
  (d + power_z * se < log(1 + threshold)), so a slowdown of the threshold's size is caught with
  probability POWER once it is significant;
- not significant: **unchanged** only where the test could have seen a change of the threshold's size
  ((crit + power_z) * se <= log(1 + threshold)); otherwise **underpowered**: the gate cannot reach its
  stated error rates and says so, with the --repeat that would, and never passes.

benchmarks/gate_power.py prints the false alarms and power of exactly this function per op class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moelab.core.spec import MAX_REPEATS

KERNEL_BOUND, HOST_SYNC = "kernel-bound", "host-sync"
OP_CLASS = {
    "layout": HOST_SYNC,
    "dispatch_fresh": HOST_SYNC,
    "roundtrip": HOST_SYNC,
    "dispatch": KERNEL_BOUND,
    "combine": KERNEL_BOUND,
    "pair": KERNEL_BOUND,
}
# priors: a few times the largest between-process CV seen on 2xH200 with --repeat 3 for each class
PRIOR_CV = {KERNEL_BOUND: 0.005, HOST_SYNC: 0.25}
ALPHA = 0.001  # one-sided false-alarm rate per direction
POWER = 0.99  # chance a significant slowdown of the threshold's size is called a regression
MIN_HISTORY_RUNS = 3  # fewer earlier runs than this: the prior, not the history
HISTORY_RUNS = 20  # the newest earlier runs the noise is learned from (older ones may predate a change)
MAX_REPEAT_ADVICE = MAX_REPEATS  # advice never names a count `--repeat` refuses

UNCHANGED, REGRESSION, IMPROVEMENT, UNDERPOWERED = "unchanged", "regression", "improvement", "underpowered"


def op_class(op: str) -> str:
    """Ops not named (a layer op of the e2e check) are held to the host-sync prior: the wider one."""
    return OP_CLASS.get(op, HOST_SYNC)


@dataclass(frozen=True, kw_only=True, slots=True)
class Noise:
    sigma: float  # standard deviation of log(per-process median)
    df: int | None  # degrees of freedom of its estimate; None: a prior, held as known
    source: str  # where it came from, for the verdict's note

    @property
    def cv(self) -> float:
        return math.sqrt(math.exp(self.sigma**2) - 1.0)

    def quantile(self, p: float) -> float:
        from scipy import stats  # here, not at import: `moelab check --help` and friends start without scipy

        return float(stats.norm.ppf(p) if self.df is None else stats.t.ppf(p, self.df))

    @property
    def crit(self) -> float:
        return self.quantile(1.0 - ALPHA)

    @property
    def power_z(self) -> float:
        return self.quantile(POWER)

    def repeats_needed(self, threshold: float) -> int:
        """Starts a side at which a change of `threshold` is told from noise at ALPHA and POWER."""
        need = 2.0 * ((self.crit + self.power_z) * self.sigma / math.log1p(threshold)) ** 2
        return min(MAX_REPEAT_ADVICE, max(1, math.ceil(need)))


def _sum_squares(groups: Sequence[np.ndarray]) -> tuple[float, int]:
    ss, df = 0.0, 0
    for g in groups:
        if g.size > 1:
            ss += float(((g - g.mean()) ** 2).sum())
            df += g.size - 1
    return ss, df


def estimate(op: str, history: Sequence[np.ndarray], base: np.ndarray, cand: np.ndarray) -> Noise:
    """The noise of one case and op. `history`: log per-process medians of each earlier run (newest
    last); `base`, `cand`: the two runs' own log per-process medians.

    With MIN_HISTORY_RUNS earlier runs or more, the spread of all their process medians around their
    common mean (between runs and between starts alike) pooled with each run's spread between its own
    starts. Otherwise the op class's prior, or the runs' own spread where that is wider."""
    recent = [np.asarray(h, dtype=np.float64) for h in history[-HISTORY_RUNS:] if len(h)]
    own_ss, own_df = _sum_squares([base, cand])
    if len(recent) >= MIN_HISTORY_RUNS:
        hist_ss, hist_df = _sum_squares([np.concatenate(recent)])
        sigma = float(pooled_sigma(hist_ss + own_ss, hist_df + own_df))
        return Noise(sigma=sigma, df=hist_df + own_df, source=f"learned from {len(recent)} earlier runs")
    klass = op_class(op)
    prior = prior_sigma(op)
    source = f"prior for {klass} ops ({len(recent)} earlier runs on this hardware and software)"
    if own_df and pooled_sigma(own_ss, own_df) > prior:
        return Noise(
            sigma=float(pooled_sigma(own_ss, own_df)), df=own_df, source=f"{source}, widened by its starts"
        )
    return Noise(sigma=prior, df=None, source=source)


def prior_sigma(op: str) -> float:
    """The log-scale spread of the op class's prior CV."""
    return math.sqrt(math.log1p(PRIOR_CV[op_class(op)] ** 2))


def pooled_sigma(sum_squares: np.ndarray | float, df: int) -> np.ndarray | float:
    """sqrt(SS / df), kept off zero (identical medians would make every difference significant);
    vectorized for the power benchmark."""
    return np.maximum(np.sqrt(np.asarray(sum_squares) / df), 1e-6)


@dataclass(frozen=True, kw_only=True, slots=True)
class Shift:
    status: str  # UNCHANGED, REGRESSION, IMPROVEMENT or UNDERPOWERED
    change: float  # exp(d) - 1
    se: float  # standard error of d
    p_value: float  # one-sided, in the direction of the change


def classify(d: np.ndarray, se: np.ndarray | float, noise: Noise, threshold: float) -> np.ndarray:
    """The status of each log change `d` (vectorized: the benchmark and the tests run thousands at once)."""
    d = np.asarray(d, dtype=np.float64)
    se_arr = np.broadcast_to(np.asarray(se, dtype=np.float64), d.shape)
    limit = math.log1p(threshold)
    slower = d > noise.crit * se_arr
    faster = d < -noise.crit * se_arr
    powered = (noise.crit + noise.power_z) * se_arr <= limit
    out = np.full(d.shape, UNCHANGED, dtype=object)
    out[~slower & ~faster & ~powered] = UNDERPOWERED
    out[slower & (d + noise.power_z * se_arr >= limit)] = REGRESSION
    out[faster & (d - noise.power_z * se_arr <= -limit)] = IMPROVEMENT
    return out


def judge_shift(base_log: np.ndarray, cand_log: np.ndarray, noise: Noise, threshold: float) -> Shift:
    """One op: the log per-process medians of each side, held to `noise`."""
    d = float(np.mean(cand_log) - np.mean(base_log))
    se = noise.sigma * math.sqrt(1.0 / base_log.size + 1.0 / cand_log.size)
    from scipy import stats

    z = abs(d) / se
    p = float(stats.norm.sf(z) if noise.df is None else stats.t.sf(z, noise.df))
    status = str(classify(np.array([d]), se, noise, threshold)[0])
    return Shift(status=status, change=math.expm1(d), se=se, p_value=p)
