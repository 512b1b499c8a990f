"""The search: successive halving over candidates, each round one stored moelab run.

Round 1 times every backend x schedule at the library default and a coarse SM grid with few iterations;
the best third (at least two, at most four) survive. Round 2 times the survivors again with more iterations, next to
SM counts between their grid neighbours and with the backend's chunk/queue variants. Round 3 re-times
the best two, the leader's best SM count joined with its best knobs (round 2 varies one at a time), and
the winning backend's default settings (serial, library SMs and knobs) with the full
iteration count: the winner, its margin over the runner-up and over the default come from that round
alone, so they compare like with like. The cost is the sum of the rounds, a fraction of the full
product (every backend x schedule x SM count x knob variant), which `TuneResult.full_product` counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from moelab.core.errors import MoelabError
from moelab.core.spec import TimingSpec
from moelab.tune.space import SCHEDULES, Candidate, coarse, default_candidate, knob_variants, refine

ROUNDS = 3
KEEP_FRACTION = 3  # round 1 keeps the best 1/3 ...
MAX_SURVIVORS = 4  # ... at most four: round 2 tries up to seven neighbours and variants of each
FINALISTS = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class Trial:
    round: int
    candidate: Candidate
    run_id: str
    case_id: str
    status: str
    tokens_per_s: float | None  # per rank: the objective (with repeats, the median over the starts)
    reason: str | None = None
    per_start: tuple[float, ...] = ()  # the objective of each start of the job (--repeat), in start order

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tokens_per_s is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneConfig:
    backends: tuple[str, ...]
    sms_grid: tuple[int, ...]
    sm_control: bool  # False on CPU ranks: gloo has no SM control
    timings: tuple[TimingSpec, TimingSpec, TimingSpec]  # rounds 1, 2, 3
    schedules: tuple[str, ...] = SCHEDULES  # the layer schedules searched (moelab.core.e2e_spec.MODES)


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneResult:
    trials: tuple[Trial, ...]
    winner: Trial
    runner_up: Trial | None
    default: Trial | None  # the winning backend's default settings, timed in the final round
    full_product: int  # trials an exhaustive search of the same space would take
    run_ids: tuple[str, ...] = field(default=())

    @staticmethod
    def margin(a: Trial, b: Trial | None) -> float | None:
        """How much faster `a` is than `b`: a / b - 1 (tokens/s)."""
        if b is None or not b.ok or not a.tokens_per_s or not b.tokens_per_s:
            return None
        return a.tokens_per_s / b.tokens_per_s - 1.0

    @staticmethod
    def margin_interval(a: Trial, b: Trial | None) -> tuple[float, float] | None:
        """The 95% bootstrap interval of the margin over the starts of the final round's jobs (--repeat):
        paired by start where both ran in one run (the k-th starts ran in the same rotation). None
        without repeats."""
        if b is None or not b.ok or len(a.per_start) < 2 or len(b.per_start) < 2:
            return None
        from moelab.core.intervals import ratio_interval

        ci = ratio_interval(b.per_start, a.per_start, paired=a.run_id == b.run_id)
        return None if ci is None else (ci.low - 1.0, ci.high - 1.0)


RoundRunner = Callable[[int, Sequence[Candidate], TimingSpec], list[Trial]]


def ranked(trials: Sequence[Trial]) -> list[Trial]:
    return sorted((t for t in trials if t.ok), key=lambda t: -(t.tokens_per_s or 0.0))


def full_product(config: TuneConfig) -> int:
    per_backend = 0
    for b in config.backends:
        sms_values = [None, *config.sms_grid] if config.sm_control else [None]
        for s in sms_values:
            per_backend += 1 + len(knob_variants(Candidate.make(b, "tbo", s)))
    return per_backend * len(config.schedules)


def best_of_both(best: Sequence[Trial]) -> Candidate | None:
    """The leader's backend and schedule with the best SM count and the best knobs found for them, when those
    came from different trials (round 2 varies one of the two at a time)."""
    if not best:
        return None
    lead = best[0].candidate
    same = [t.candidate for t in best if (t.candidate.backend, t.candidate.mode) == (lead.backend, lead.mode)]
    best_sms = next((c.sms for c in same if not c.knobs), lead.sms)  # `best` is ranked: first is best
    best_knobs = next((c.knobs for c in same if c.knobs), lead.knobs)
    mixed = Candidate(lead.backend, lead.mode, best_sms, best_knobs)
    return None if mixed in same else mixed


def tune(config: TuneConfig, run_round: RoundRunner) -> TuneResult:
    """Successive halving; `run_round(round, candidates, timing)` times candidates and returns one trial each."""
    trials: list[Trial] = []
    r1 = run_round(
        1, coarse(config.backends, config.sms_grid, config.sm_control, config.schedules), config.timings[0]
    )
    trials += r1
    best1 = ranked(r1)
    if not best1:
        reasons = "; ".join(sorted({f"{t.candidate.backend}: {t.reason}" for t in r1 if t.reason}))[:1500]
        raise MoelabError(f"tune: no trial of round 1 ran correctly ({reasons or 'no trials'})")
    keep = min(MAX_SURVIVORS, max(2, math.ceil(len(r1) / KEEP_FRACTION)))
    survivors = [t.candidate for t in best1[:keep]]
    second = refine(survivors, config.sms_grid, config.sm_control)
    if len(second) > len(survivors):
        r2 = run_round(2, second, config.timings[1])
        trials += r2
        best2 = ranked(r2) or best1
    else:  # nothing new to try next to the survivors: round 2 would only repeat round 1
        best2 = best1
    finalists = [t.candidate for t in best2[:FINALISTS]]
    mixed = best_of_both(best2)
    default = default_candidate(finalists[0].backend)
    final = list(dict.fromkeys([*finalists, *([mixed] if mixed else []), default]))
    r3 = run_round(ROUNDS, final, config.timings[2])
    trials += r3
    best3 = ranked(r3)
    if not best3:
        raise MoelabError("tune: no trial of the final round ran correctly")
    winner = best3[0]
    runner_up = next((t for t in best3[1:] if t.candidate != winner.candidate), None)
    default_trial = next((t for t in r3 if t.candidate == default), None)
    return TuneResult(
        trials=tuple(trials),
        winner=winner,
        runner_up=runner_up,
        default=default_trial,
        full_product=full_product(config),
        run_ids=tuple(dict.fromkeys(t.run_id for t in trials)),
    )
