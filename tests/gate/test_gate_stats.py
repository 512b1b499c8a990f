"""The gate's statistics at any sample count: no crash from 2 to 100,000 samples per side, the same p as
scipy's Mann-Whitney U, and the false-positive rate and power of the whole decision at large n."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from moelab.gate.decision import Policy, compare_op
from moelab.gate.mannwhitney import exact_cdf, two_sided_p
from moelab.gate.stats import MWU_ALPHA, differ, extreme_p

POLICY = Policy()


def _noise(rng: np.random.Generator, n: int, spread: float, scale: float = 1.0) -> np.ndarray:
    return scale * 100.0 * rng.lognormal(0.0, spread, n)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 100_000),
    m=st.integers(2, 100_000),
    shift=st.sampled_from([1.0, 1.03, 1.2]),
    ties=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_differ_never_crashes_at_any_sample_count(
    n: int, m: int, shift: float, ties: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a, b = _noise(rng, n, 0.05), _noise(rng, m, 0.05, shift)
    if ties:  # timers with a coarse clock give many equal samples
        a, b = a.round(0), b.round(0)
    test = differ(a, b)
    assert test.method in ("mann-whitney", "disjoint-ranges", "none")
    if test.p_value is not None:
        assert 0.0 <= test.p_value <= 1.0
    if min(n, m) >= 200 and shift == 1.2:
        assert test.significant, test  # a 20% shift at this n is never missed


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 100_000), m=st.integers(1, 100_000))
def test_extreme_p_in_log_space_matches_the_exact_ratio(n: int, m: int) -> None:
    p = extreme_p(n, m)
    assert 0.0 <= p <= 1.0
    log_exact = math.log(2) - (math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1))
    if log_exact > -700:  # representable as a normal float
        assert math.log(p) == pytest.approx(log_exact, rel=1e-9, abs=1e-9)
    else:
        assert p < 1e-300


def test_the_sizes_that_used_to_overflow() -> None:
    rng = np.random.default_rng(0)
    for n in (514, 515, 516, 5_000, 100_000):
        assert differ(_noise(rng, n, 0.02), _noise(rng, n, 0.02, 1.1)).significant


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 60),
    m=st.integers(1, 60),
    ties=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_p_equals_scipys_auto_method(n: int, m: int, ties: bool, seed: int) -> None:
    """Sizes kept where scipy's own exact path is fast (its null distribution is quadratic in n*m/2)."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 1, n), rng.normal(rng.uniform(-1, 1), 1, m)
    if ties:
        a, b = a.round(0), b.round(0)
    ours = two_sided_p(a, b)
    theirs = float(scipy_stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    if math.isnan(theirs):  # scipy: every value equal
        assert ours == 1.0
    else:
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("n", "m"), [(500, 600), (5_000, 3_000), (100_000, 100_000), (8, 2_000)])
def test_p_equals_scipy_at_large_n(n: int, m: int) -> None:
    rng = np.random.default_rng(n + m)
    a, b = _noise(rng, n, 0.05), _noise(rng, m, 0.05, 1.002)
    method = "exact" if min(n, m) <= 8 else "asymptotic"
    theirs = float(scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method=method).pvalue)
    assert two_sided_p(a, b) == pytest.approx(theirs, rel=1e-7, abs=1e-12)


@pytest.mark.parametrize(("n1", "n2"), [(1, 1), (2, 3), (3, 5), (4, 4), (5, 6)])
def test_exact_distribution_by_enumeration(n1: int, n2: int) -> None:
    """P(U <= k) counted over every way of placing n1 of n1 + n2 ranks."""
    us = []
    for picked in itertools.combinations(range(n1 + n2), n1):
        us.append(sum(picked) - n1 * (n1 - 1) // 2)  # ranks from 0: U = rank sum - minimum
    total = math.comb(n1 + n2, n1)
    for k in range(-1, n1 * n2 + 1):
        assert exact_cdf(k, n1, n2) == pytest.approx(sum(u <= k for u in us) / total, rel=1e-12)


def test_one_side_of_five_against_a_hundred_thousand_is_fast_and_exact() -> None:
    """scipy's exact path would loop ~(5 * 100,000 / 2)^2 times here; this one is one NumPy pass per sample."""
    rng = np.random.default_rng(1)
    a, b = _noise(rng, 5, 0.02, 1.3), _noise(rng, 100_000, 0.02)
    p = two_sided_p(a, b)
    assert p == pytest.approx(2 * math.comb(5, 5) / math.comb(100_005, 5), rel=1e-6)  # all five above all


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_false_positive_rate_and_power_at_large_n(n: int) -> None:
    """Same distribution: the gate (5% threshold and p < 0.002) flags nothing; the U test alone stays
    near its 0.2% level. A 7% slowdown at 3% noise is always caught; a real 2% one is not a regression
    (under the threshold), however significant."""
    trials = 60
    rng = np.random.default_rng(n)
    gate_fp = test_fp = caught = small = 0
    for _ in range(trials):
        base = _noise(rng, n, 0.03)
        gate_fp += compare_op("c", "dispatch", base, _noise(rng, n, 0.03), POLICY).status == "regression"
        test_fp += bool(differ(base, _noise(rng, n, 0.03)).significant)
        caught += compare_op("c", "dispatch", base, _noise(rng, n, 0.03, 1.07), POLICY).status == "regression"
        small += compare_op("c", "dispatch", base, _noise(rng, n, 0.03, 1.02), POLICY).status == "regression"
    assert gate_fp == 0 and small == 0
    assert test_fp <= 2, f"U test flagged {test_fp}/{trials} pure-noise draws at p < {MWU_ALPHA}"
    assert caught == trials
