"""The gate's decision, case by case and op by op.

Cases of the candidate and the baseline are matched on (backend, hidden, tokens per rank, topk, experts
per rank, routing, seed, dtype, SMs, knobs, world) and then by op. A matched op is a **regression** only
when both hold:

1. the median time grew by more than the threshold (default 5%): small, real shifts from a driver or
   clock change are not worth a red build;
2. the change is outside the noise, judged by one of two rules, named with every verdict:
   - **processes** (both runs have repeats, --repeat N >= 2): Student's t-test on the logarithms of the
     per-process medians at p < 0.02 (stats.processes_differ). The variance that decides "did it get
     slower" lies between processes, which only repeats sample; the median then is the median of the
     per-process medians, with its bootstrap interval (moelab.core.intervals) shown beside it.
     benchmarks/gate_power.py prints why these defaults: on synthetic histories with process-level noise,
     false alarms stay at or under 1% at any noise, and +10% is caught at least 95% of the time up to a
     1.5% CV between processes with 3 repeats, 2% with 5;
   - **iterations** (today's rule, without repeats on both sides, said so in the output): Mann-Whitney
     U on the per-iteration samples at p < 0.002, else with few samples non-overlapping ranges
     (stats.differ). It treats the iterations of one process as independent, so on a busy machine two
     identical runs can differ "significantly": a run moelab flags as contended is never judged by it.

The same tests in the other direction make an **improvement**. A change past the threshold that the test
cannot separate from noise is **noise**; one with too few samples to test is **inconclusive** (both are
reported, neither fails). What the gate cannot judge it says and never passes:

- **invalid**: an op the baseline measured whose samples, on either side, are missing, NULL, NaN,
  infinite or not above zero (exit 3);
- **contended**: a case either run marks suspect (other work on the machine, health worsening, a spread
  far above its history): no regression verdict, its own exit code (4);
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
from moelab.gate.samples import CaseSide, Side, key_text
from moelab.gate.stats import FALLBACK_LEVEL, MWU_ALPHA, PROCESS_ALPHA, Test, differ, processes_differ

OPS = tuple(OP_DEFINITIONS)
FAILING = ("regression", "broken")
UNJUDGED = ("invalid",)  # exit 3
STATUS_ORDER = (
    "broken",
    "regression",
    "invalid",
    "contended",
    "missing",
    "inconclusive",
    "noise",
    "improvement",
    "new",
    "unchanged",
)
EXIT_REGRESSION, EXIT_CANNOT_JUDGE, EXIT_CONTENDED = 1, 3, 4
PROCESS_RULE, ITERATION_RULE = "processes", "iterations"


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    threshold: float = 0.05  # relative change of the median time
    alpha: float = MWU_ALPHA
    fallback_level: float = FALLBACK_LEVEL
    process_alpha: float = PROCESS_ALPHA
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
    rule: str | None = None  # PROCESS_RULE or ITERATION_RULE: which decided
    ratio_low: float | None = None  # bootstrap interval of cand/base over processes (processes rule)
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
        return [r for r in (PROCESS_RULE, ITERATION_RULE) if r in used]

    def sorted(self) -> list[Verdict]:
        return sorted(self.verdicts, key=lambda v: (STATUS_ORDER.index(v.status), v.case, v.op or ""))


def _tested(v: Verdict, test: Test, *, too_few: str, noise: str) -> Verdict:
    """The verdict of a change past the threshold, from the test of either rule."""
    if test.significant is None:
        return replace(v, status="inconclusive", method=test.method, note=too_few)
    if not test.significant:
        return replace(v, status="noise", method=test.method, p_value=test.p_value, note=noise)
    status = "regression" if v.change is not None and v.change > 0 else "improvement"
    return replace(v, status=status, method=test.method, p_value=test.p_value)


def compare_op(case: str, op: str, base: np.ndarray, cand: np.ndarray, policy: Policy) -> Verdict:
    """The iterations rule: medians of the per-iteration times, Mann-Whitney U (stats.differ)."""
    bm, cm = float(np.median(base)), float(np.median(cand))
    change = cm / bm - 1.0 if bm > 0 else float("inf")
    v = Verdict(
        case=case,
        op=op,
        status="unchanged",
        base_median_us=bm,
        cand_median_us=cm,
        change=change,
        base_n=int(base.size),
        cand_n=int(cand.size),
        rule=ITERATION_RULE,
    )
    if abs(change) <= policy.threshold:
        return v
    test = differ(base, cand, policy.alpha, policy.fallback_level)
    too_few = f"too few samples to test ({base.size} and {cand.size}; 5 and 5 at least)"
    return _tested(v, test, too_few=too_few, noise="within the measured noise")


def compare_processes(
    case: str, op: str, base: np.ndarray, cand: np.ndarray, policy: Policy, interval: bool = True
) -> Verdict:
    """The processes rule: medians of the per-process medians, a t-test on their logarithms, and the
    bootstrap interval of their ratio (independent: two runs share no start conditions; `interval`:
    form it, which the decision does not need)."""
    from moelab.core.intervals import median_of_medians, ratio_interval

    bm, cm = median_of_medians(base), median_of_medians(cand)
    change = cm / bm - 1.0
    ci = ratio_interval(base, cand) if interval else None
    v = Verdict(
        case=case,
        op=op,
        status="unchanged",
        base_median_us=bm,
        cand_median_us=cm,
        change=change,
        base_n=int(base.size),
        cand_n=int(cand.size),
        rule=PROCESS_RULE,
        ratio_low=ci.low if ci else None,
        ratio_high=ci.high if ci else None,
    )
    if abs(change) <= policy.threshold:
        return v
    test = processes_differ(base, cand, policy.process_alpha)
    return _tested(
        v, test, too_few="fewer than 2 processes a side", noise="within the variation between processes"
    )


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


def judge_op(case: str, op: str, b: CaseSide, c: CaseSide, policy: Policy) -> Verdict:
    """One op the baseline measured: invalid, contended, or judged by the processes or iterations rule."""
    why = _invalid(b, op, "baseline") or _invalid(c, op, "candidate")
    if why:
        return Verdict(case=case, op=op, status="invalid", note=f"{why}: cannot judge")
    if op in b.process_medians and op in c.process_medians:
        v = compare_processes(case, op, b.process_medians[op], c.process_medians[op], policy)
    else:
        v = compare_op(case, op, b.times[op], c.times[op], policy)
    suspect = [f"{n}: {s.suspect_reason}" for n, s in (("baseline", b), ("candidate", c)) if s.suspect_reason]
    if suspect:
        note = "not judged, the machine was shared or unhealthy (" + "; ".join(suspect) + ")"
        return replace(v, status="contended", method=None, p_value=None, rule=None, note=note[:600])
    return v


def _case_verdicts(text: str, b: CaseSide, c: CaseSide | None, policy: Policy) -> list[Verdict]:
    if c is None:
        return [Verdict(case=text, op=None, status="missing", note="not in the candidate run")]
    if c.status != "ok":
        broken = c.status in ("failed", "incorrect", "crashed", "timeout")
        status = "broken" if broken else "missing"
        return [Verdict(case=text, op=None, status=status, note=f"{c.status}: {c.reason or ''}".strip())]
    ops = [op for op in OPS if op in b.ops or op in b.times]
    return [judge_op(text, op, b, c, policy) for op in ops]


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
        result.verdicts += _case_verdicts(key_text(key), b, cand.cases.get(key), policy)
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
