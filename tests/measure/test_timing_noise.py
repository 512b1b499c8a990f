"""The stopping rule's noise figure and the stability verdict."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.record_build import OpMeasurement, stability, summary_of
from moelab.measure.timing import median_noise


def test_noise_shrinks_with_more_samples_of_the_same_spread() -> None:
    rng = np.random.default_rng(0)
    few = median_noise(100 * rng.lognormal(0, 0.05, 20))
    many = median_noise(100 * rng.lognormal(0, 0.05, 2000))
    assert many < few / 4
    assert median_noise(np.full(50, 7.0)) == 0.0
    assert math.isinf(median_noise(np.array([1.0, 2.0])))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=6, max_size=400))
def test_noise_is_finite_and_non_negative(values: list[float]) -> None:
    n = median_noise(np.asarray(values))
    assert n >= 0 and math.isfinite(n)


def test_a_bimodal_op_with_a_host_sync_is_unstable_with_its_reason() -> None:
    fast, slow = [400.0] * 15, [770.0] * 15
    samples = [fast + slow, fast + slow]
    m = OpMeasurement(op="dispatch", samples_us=samples, bytes_per_row=1, noise=0.3, noise_target=0.02,
                      host_sync="stream sync")  # fmt: skip
    why = stability(m, summary_of(samples, 0.3))
    assert why is not None and "more than one mode" in why and "host sync (stream sync)" in why


def test_a_tight_op_is_stable() -> None:
    samples = [[100.0 + 0.1 * i for i in range(30)]] * 2
    m = OpMeasurement(op="combine", samples_us=samples, bytes_per_row=1, noise=0.001, noise_target=0.02)
    assert stability(m, summary_of(samples, 0.001)) is None
