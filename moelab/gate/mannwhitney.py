"""Two-sided Mann-Whitney U in NumPy, the same p as scipy.stats.mannwhitneyu(method="auto").

Why not scipy itself: importing scipy.stats costs about a second, which `moelab check` would pay on every
CI job, and scipy's exact path builds the null distribution of U with a Python loop quadratic in
n1 * n2 / 2, which never ends when a side with a few samples (the pair op keeps 5) meets one with many
thousands. Here the exact null distribution is the Gaussian binomial coefficient [n1 + n2 choose n1]_q,
built from the left tail (all that a two-sided p needs) with one NumPy pass per sample of the smaller side.

Method choice as scipy's "auto": exact when one side has at most 8 samples and there are no ties, else
the normal approximation with the tie correction and the continuity correction. tests/gate/test_gate_stats.py
holds the two to each other.
"""

from __future__ import annotations

import math

import numpy as np

EXACT_MAX_SMALLER_SIDE = 8  # scipy's "auto": exact when either side has at most this many samples


def u_statistic(a: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray]:
    """(U of `a`, sizes of the groups of tied values) from average ranks over both samples."""
    values, inverse, counts = np.unique(np.concatenate([a, b]), return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0
    r1 = float(avg_rank[inverse[: a.size]].sum())
    return r1 - a.size * (a.size + 1) / 2.0, counts


def exact_cdf(k: int, n1: int, n2: int) -> float:
    """P(U <= k) under no difference, for sample sizes n1 and n2 without ties.

    The counts of U = 0..k are the first coefficients of prod_{i=1..s} (1 - q^(l+i)) / (1 - q^i), s the
    smaller size and l the larger: each factor is a shifted subtraction and a strided running sum, and
    coefficients past k are never needed. Divided by C(n1 + n2, n1) in log space so nothing overflows.
    """
    small, large = min(n1, n2), max(n1, n2)
    if k < 0:
        return 0.0
    k = min(k, small * large)
    counts = np.zeros(k + 1, dtype=np.float64)
    counts[0] = 1.0
    for i in range(1, small + 1):
        shift = large + i
        if shift <= k:
            counts[shift:] -= counts[: k + 1 - shift].copy()
        # divide by (1 - q^i): c[j] += c[j - i], a running sum over each residue class modulo i
        pad = (-counts.size) % i
        grid = np.concatenate([counts, np.zeros(pad)]).reshape(-1, i)
        counts = np.cumsum(grid, axis=0).reshape(-1)[: k + 1]
    log_total = math.lgamma(n1 + n2 + 1) - math.lgamma(n1 + 1) - math.lgamma(n2 + 1)
    total = float(np.sum(counts))
    if total <= 0:
        return 0.0
    return min(1.0, math.exp(math.log(total) - log_total))


def two_sided_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of Mann-Whitney U for samples a and b (each non-empty)."""
    n1, n2 = int(a.size), int(b.size)
    u1, ties = u_statistic(a, b)
    u = max(u1, n1 * n2 - u1)
    has_ties = bool(np.any(ties > 1))
    if min(n1, n2) <= EXACT_MAX_SMALLER_SIDE and not has_ties:
        # P(U >= u) = P(U <= n1 n2 - u) by symmetry; u is a whole number without ties
        return min(1.0, 2.0 * exact_cdf(int(round(n1 * n2 - u)), n1, n2))
    n = n1 + n2
    tie_term = float(np.sum(ties.astype(np.float64) ** 3 - ties))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return 1.0  # every value equal: no evidence of any difference
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return min(1.0, max(0.0, math.erfc(z / math.sqrt(2.0))))  # 2 * P(Z > z)
