"""The gate's "use --repeat N" advice never names a count `moelab run --repeat` refuses (it said 10000
on a 2xH200 acceptance run, where --repeat takes at most 1,000)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.spec import MAX_REPEATS
from moelab.gate.noise import Noise


@settings(deadline=None)
@given(sigma=st.floats(min_value=1e-4, max_value=10.0), df=st.one_of(st.none(), st.integers(1, 500)))
def test_advice_is_a_count_repeat_takes(sigma: float, df: int | None) -> None:
    need = Noise(sigma=sigma, df=df, source="test").repeats_needed(0.05)
    assert 1 <= need <= MAX_REPEATS


def test_a_noise_no_repeat_count_beats_is_said_so() -> None:
    assert Noise(sigma=2.0, df=None, source="test").repeats_needed(0.05) == MAX_REPEATS
