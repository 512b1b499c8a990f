"""Synthetic trials of the gate's decision (moelab.gate.noise), all at once with numpy: how often it
false-alarms and how often it catches a slowdown, per op class, repeat count and history length. The
power benchmark (benchmarks/gate_power.py) prints them and the tests hold the decision to them; both run
noise.classify, the function the gate calls, on noise pooled by noise.pooled_sigma as noise.estimate does.

Each trial: `history_runs` earlier runs of `repeats` starts, a baseline and a candidate of `repeats`
starts each, every start's median lognormal with the given CV around the case's level (the candidate's
multiplied by 1 + shift)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moelab.gate.noise import (
    HISTORY_RUNS,
    IMPROVEMENT,
    MIN_HISTORY_RUNS,
    REGRESSION,
    UNDERPOWERED,
    Noise,
    classify,
    pooled_sigma,
    prior_sigma,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    regression: float  # fraction of trials called a regression
    improvement: float
    underpowered: float  # "cannot judge": the gate said it could not reach its error rates

    @property
    def judged(self) -> float:
        return 1.0 - self.underpowered


def _ss(x: np.ndarray) -> np.ndarray:
    """Sum of squares about the mean along the last axis."""
    return ((x - x.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)


def trials(
    op: str,
    cv: float,
    repeats: int,
    shift: float,
    num_trials: int,
    history_runs: int = HISTORY_RUNS,
    threshold: float = 0.05,
    seed: int = 0,
) -> np.ndarray:
    """The status of each of `num_trials` synthetic checks of `op` (its prior comes from its class)."""
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(cv**2))
    base = rng.normal(0.0, sigma, (num_trials, repeats))
    cand = rng.normal(math.log1p(shift), sigma, (num_trials, repeats))
    d = cand.mean(axis=1) - base.mean(axis=1)
    scale = math.sqrt(2.0 / repeats)
    own_ss, own_df = _ss(base) + _ss(cand), 2 * (repeats - 1)
    if history_runs >= MIN_HISTORY_RUNS:
        hist = rng.normal(0.0, sigma, (num_trials, history_runs * repeats))
        df = hist.shape[1] - 1 + own_df
        est = pooled_sigma(_ss(hist) + own_ss, df)
        return classify(d, est * scale, Noise(sigma=1.0, df=df, source="synthetic"), threshold)
    prior = prior_sigma(op)
    out = classify(d, prior * scale, Noise(sigma=prior, df=None, source="prior"), threshold)
    if own_df:
        own = np.asarray(pooled_sigma(own_ss, own_df))
        wider = own > prior
        widened = classify(d, own * scale, Noise(sigma=1.0, df=own_df, source="own"), threshold)
        out[wider] = widened[wider]
    return out


def rates(statuses: np.ndarray) -> Rates:
    n = max(1, statuses.size)
    return Rates(
        regression=float((statuses == REGRESSION).sum()) / n,
        improvement=float((statuses == IMPROVEMENT).sum()) / n,
        underpowered=float((statuses == UNDERPOWERED).sum()) / n,
    )
