"""Issue 38's synthetic acceptance of the gate's decision (moelab.gate.noise), through the vectorized trials
of moelab.gate.power, which call the same classify() the gate does: per-process CV 0.2% (a kernel-bound
op) and 10% (an op with a host sync), 1000 null trials each."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.gate.noise import (
    REGRESSION,
    UNCHANGED,
    UNDERPOWERED,
    estimate,
    judge_shift,
    op_class,
)
from moelab.gate.power import rates, trials

NULL_TRIALS = 1000
CLASSES = (("combine", 0.002), ("roundtrip", 0.10))


@pytest.mark.parametrize("history_runs", [20, 0])
@pytest.mark.parametrize("repeats", [1, 3, 5])
@pytest.mark.parametrize(("op", "cv"), CLASSES)
def test_false_alarms_at_most_one_percent(op: str, cv: float, repeats: int, history_runs: int) -> None:
    r = rates(trials(op, cv, repeats, 0.0, NULL_TRIALS, history_runs=history_runs, seed=repeats))
    assert r.regression <= 0.01
    assert r.improvement <= 0.01


@pytest.mark.parametrize("history_runs", [20, 0])
def test_five_percent_caught_on_kernel_bound_at_repeat_3(history_runs: int) -> None:
    r = rates(trials("combine", 0.002, 3, 0.05, NULL_TRIALS, history_runs=history_runs, seed=7))
    assert r.regression >= 0.95


def test_host_sync_noise_is_never_a_pass() -> None:
    """At CV 10% a +5% change cannot be told from noise at repeat 3: the gate says so instead of passing."""
    statuses = trials("roundtrip", 0.10, 3, 0.05, NULL_TRIALS, seed=3)
    assert not np.any(statuses == UNCHANGED)
    assert rates(statuses).underpowered > 0.9


def test_op_classes() -> None:
    assert {op_class(o) for o in ("dispatch", "combine", "pair")} == {"kernel-bound"}
    assert {op_class(o) for o in ("layout", "dispatch_fresh", "roundtrip", "attn_layer")} == {"host-sync"}


def test_noise_learned_from_history() -> None:
    rng = np.random.default_rng(0)
    history = [rng.normal(5.0, 0.002, 1) for _ in range(20)]
    noise = estimate("roundtrip", history, np.array([5.0]), np.array([5.0]))
    assert noise.df == 19 and noise.sigma < 0.004 and "20 earlier runs" in noise.source
    shift = judge_shift(np.array([5.0]), np.array([5.0 + np.log(1.05)]), noise, 0.05)
    assert shift.status == REGRESSION  # a host-sync op whose history is quiet is judged as such


def test_prior_without_history_says_how_many_repeats() -> None:
    noise = estimate("roundtrip", [], np.log([100.0]), np.log([103.0]))
    assert noise.df is None and "prior for host-sync" in noise.source
    shift = judge_shift(np.log([100.0]), np.log([103.0]), noise, 0.05)
    assert shift.status == UNDERPOWERED
    assert noise.repeats_needed(0.05) > 100
