"""The gate's decision, case by case and op by op.

Cases of the candidate and the baseline are matched on (backend, hidden, tokens per rank, topk, experts
per rank, routing, seed, dtype, SMs, knobs, world) and then by op. Each matched op is judged by one rule,
moelab.gate.noise, on the per-process medians of each side (one per start of the job, --repeat; a run
without repeats has one): the difference of their mean logarithms held to the op's noise between
processes, learned from the store's earlier runs of the same case on the same hardware and software
(Side.history), or a prior per op class (kernel-bound, host-sync) where there are too few. A change is a
**regression** when it is significant at a one-sided 0.1% and not confidently below the threshold (default
5%); the same in the other direction is an **improvement**; an op whose noise is too wide for the test to
see a change of the threshold's size is **underpowered**: "cannot judge: +X% is within this op's noise;
use --repeat N" (exit 3), never a pass. benchmarks/gate_power.py prints its false alarms and power per op
class, from the same function. The bootstrap interval of the ratio over processes is shown beside it where
both runs have repeats.

What the gate cannot judge it says and never passes:

- **invalid**: an op the baseline measured whose samples, on either side, are missing, NULL, NaN,
  infinite or not above zero (exit 3);
- **contended**: a case either run found contended while it ran (host load, other runs on the machine,
  health worsening: the mark ingest stores): no regression verdict, its own exit code (4). What judging
  against history noticed afterwards (drift: a median far from the previous run's; spread) is named in the
  note and never makes a case contended: drift is what a regression looks like;
- a different GPU model, driver, CUDA, NCCL or world size between the runs: refused as a whole (exit 3)
  unless allowed (Policy.allow_different_hardware), and named in the verdict either way.

A case the baseline measured that the candidate measured as failed or incorrect is **broken** and fails
the gate; one the candidate lacks is **missing** (fails only with fail_on_missing); one only the candidate
has is **new**.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from moelab.core.ops import OPS as OP_DEFINITIONS
from moelab.gate import noise as noise_model
from moelab.gate.samples import CaseKey, CaseSide, Side, key_text

OPS = tuple(OP_DEFINITIONS)
FAILING = ("regression", "broken")
UNJUDGED = ("invalid", "underpowered")  # exit 3
STATUS_ORDER = (
    "broken",
    "regression",
    "invalid",
    "underpowered",
    "contended",
    "missing",
    "inconclusive",
    "noise",
    "improvement",
    "new",
    "unchanged",
)
EXIT_REGRESSION, EXIT_CANNOT_JUDGE, EXIT_CONTENDED = 1, 3, 4
NOISE_RULE = "noise"


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    threshold: float = 0.05  # relative change of the median time
    fail_on_missing: bool = False
    allow_different_hardware: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 10:
            raise ValueError(f"threshold must be a fraction between 0 and 10, got {self.threshold}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    case: str  # readable key
    op: str | None  # None for case-level verdicts (missing, new, broken)
    status: str
    base_median_us: float | None = None
    cand_median_us: float | None = None
    change: float | None = None  # cand/base - 1 of the median time
    method: str | None = None
    p_value: float | None = None
    base_n: int = 0
    cand_n: int = 0
    rule: str | None = None  # NOISE_RULE where an op was tested
    noise_cv: float | None = None  # the op's CV between processes the test used
    noise_source: str = ""  # learned from history, or the op class's prior
    ratio_low: float | None = None  # bootstrap interval of cand/base over processes (both runs with repeats)
    ratio_high: float | None = None
    note: str = ""


@dataclass(kw_only=True, slots=True)
class GateResult:
    baseline: str  # how the baseline was found, for humans
    baseline_run: str
    candidate_run: str
    policy: Policy
    verdicts: list[Verdict] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)  # hardware/software the two runs do not share
    base_repeats: int = 1
    cand_repeats: int = 1

    def count(self, status: str) -> int:
        return sum(1 for v in self.verdicts if v.status == status)

    @property
    def refused(self) -> bool:
        """The runs differ in hardware or software and the user did not allow comparing them."""
        return bool(self.differences) and not self.policy.allow_different_hardware

    @property
    def failing(self) -> list[Verdict]:
        bad = FAILING + (("missing",) if self.policy.fail_on_missing else ())
        return [v for v in self.verdicts if v.status in bad]

    @property
    def exit_code(self) -> int:
        if self.failing:
            return EXIT_REGRESSION
        if self.refused or any(v.status in UNJUDGED for v in self.verdicts):
            return EXIT_CANNOT_JUDGE
        if self.count("contended"):
            return EXIT_CONTENDED
        return 0

    @property
    def rules(self) -> list[str]:
        """The rules that decided, in a fixed order."""
        used = {v.rule for v in self.verdicts if v.rule}
        return [r for r in (NOISE_RULE,) if r in used]

    def sorted(self) -> list[Verdict]:
        return sorted(self.verdicts, key=lambda v: (STATUS_ORDER.index(v.status), v.case, v.op or ""))


def _invalid(side: CaseSide, op: str, name: str) -> str | None:
    """Why `side`'s samples of `op` cannot be judged, or None."""
    if op in side.invalid:
        bad, total = side.invalid[op]
        return f"{name}: {bad} of {total} samples are NULL, NaN, infinite or not above zero"
    if op not in side.times:
        stored = "a result but no samples" if op in side.ops else "no result"
        return f"{name} has {stored} for this op"
    if side.times[op].size == 0:
        return f"{name} has no valid samples for this op"
    return None


def judge_processes(
    case: str, op: str, base: np.ndarray, cand: np.ndarray, history: list[list[float]], policy: Policy
) -> Verdict:
    """One op from the per-process medians of each side and the earlier runs' (oldest first)."""
    from moelab.core.intervals import median_of_medians, ratio_interval

    base_log, cand_log = np.log(base), np.log(cand)
    noise = noise_model.estimate(op, [np.log(np.asarray(h)) for h in history], base_log, cand_log)
    shift = noise_model.judge_shift(base_log, cand_log, noise, policy.threshold)
    ci = ratio_interval(base, cand) if base.size > 1 and cand.size > 1 else None
    held_to = f"CV {100 * noise.cv:.2g}% between processes, {noise.source}"
    note = f"noise: {held_to}"
    if shift.status == noise_model.UNDERPOWERED:
        need = noise.repeats_needed(policy.threshold)
        advice = (
            f"use --repeat {need}"
            if need < noise_model.MAX_REPEAT_ADVICE
            else f"more starts than --repeat allows ({noise_model.MAX_REPEAT_ADVICE:,}): bring this op's noise "
            "down first (its spread is the finding)"
        )
        note = f"cannot judge: {100 * shift.change:+.1f}% is within this op's noise ({held_to}); {advice}"
    return Verdict(
        case=case,
        op=op,
        status=shift.status,
        base_median_us=median_of_medians(base),
        cand_median_us=median_of_medians(cand),
        change=shift.change,
        method="noise-model",
        p_value=shift.p_value,
        base_n=int(base.size),
        cand_n=int(cand.size),
        rule=NOISE_RULE,
        ratio_low=ci.low if ci else None,
        ratio_high=ci.high if ci else None,
        noise_cv=noise.cv,
        noise_source=noise.source,
        note=note,
    )


def judge_op(
    case: str, op: str, b: CaseSide, c: CaseSide, policy: Policy, history: list[list[float]] | None = None
) -> Verdict:
    """One op the baseline measured: invalid, contended, or judged against its noise."""
    why = _invalid(b, op, "baseline") or _invalid(c, op, "candidate")
    if why:
        return Verdict(case=case, op=op, status="invalid", note=f"{why}: cannot judge")
    v = judge_processes(case, op, _medians(b, op), _medians(c, op), history or [], policy)
    suspect = [f"{n}: {s.suspect_reason}" for n, s in (("baseline", b), ("candidate", c)) if s.suspect_reason]
    if suspect:
        note = "not judged, the machine was shared or unhealthy (" + "; ".join(suspect) + ")"
        return replace(v, status="contended", method=None, p_value=None, rule=None, note=note[:600])
    judged = [f"{n}: {s.judged}" for n, s in (("baseline", b), ("candidate", c)) if s.judged]
    if judged and v.status != "unchanged":
        v = replace(
            v, note=(v.note + "; " if v.note else "") + "noticed against history: " + "; ".join(judged)
        )
    return replace(v, note=v.note[:600])


def _medians(side: CaseSide, op: str) -> np.ndarray:
    """The per-process medians, else (an export or a side without them) the median of the iterations."""
    meds = side.process_medians.get(op)
    return meds if meds is not None and meds.size else np.array([float(np.median(side.times[op]))])


def _case_verdicts(
    key: CaseKey,
    b: CaseSide,
    c: CaseSide | None,
    policy: Policy,
    history: dict[tuple[str, str, str], list[list[float]]],
) -> list[Verdict]:
    text = key_text(key)
    if c is None:
        return [Verdict(case=text, op=None, status="missing", note="not in the candidate run")]
    if c.status != "ok":
        broken = c.status in ("failed", "incorrect", "crashed", "timeout")
        status = "broken" if broken else "missing"
        return [Verdict(case=text, op=None, status=status, note=f"{c.status}: {c.reason or ''}".strip())]
    ops = [op for op in OPS if op in b.ops or op in b.times]
    return [judge_op(text, op, b, c, policy, history.get((str(key[0]), c.case_id, op))) for op in ops]


def decide(
    base: Side, cand: Side, policy: Policy, baseline: str, differences: list[str] | None = None
) -> GateResult:
    result = GateResult(
        baseline=baseline,
        baseline_run=base.run_id,
        candidate_run=cand.run_id,
        policy=policy,
        differences=list(differences or []),
        base_repeats=base.repeats,
        cand_repeats=cand.repeats,
    )
    if result.refused:
        return result  # nothing is judged across hardware or software the user did not allow
    for key, b in base.cases.items():
        if b.status != "ok":
            continue  # the baseline did not measure it: nothing to hold the candidate to
        result.verdicts += _case_verdicts(key, b, cand.cases.get(key), policy, cand.history)
    for key, c in cand.cases.items():
        if c.status == "ok" and (key not in base.cases or base.cases[key].status != "ok"):
            result.verdicts.append(
                Verdict(case=key_text(key), op=None, status="new", note="not measured in the baseline")
            )
    return result


def matched(result: GateResult) -> int:
    return sum(1 for v in result.verdicts if v.op is not None)


def verdicts_by_case(result: GateResult, cand: Side) -> dict[tuple[str, str, str], str]:
    """Each op verdict of the candidate run by (backend, case id, op), for views that show them beside
    the run's own rows (the report's summary)."""
    ids = {key_text(key): (str(key[0]), side.case_id) for key, side in cand.cases.items()}
    return {(*ids[v.case], v.op): v.status for v in result.verdicts if v.op is not None and v.case in ids}
