"""The gate's decision, case by case and op by op.

Cases of the candidate and the baseline are matched on (backend, hidden, tokens per rank, topk, experts
per rank, routing, seed, dtype, SMs, knobs, world) and then by op. A matched op is a **regression** only
when both hold:

1. the median iteration time grew by more than the threshold (default 5%): small, real shifts from a
   driver or clock change are not worth a red build, and run-to-run drift that within-run samples cannot
   see (the GPU, the node, the temperature) is bounded by this margin, not by the test;
2. the change is outside the noise measured in the samples (stats.differ: Mann-Whitney U at p < 0.002,
   else, with few samples, non-overlapping sample ranges, a test at 1% or better).

The same two tests in the other direction make an **improvement**. A change past the threshold that the
samples cannot separate from noise is **noise**; one with too few samples to test is **inconclusive**
(both are reported, neither fails). A case the baseline measured that the candidate measured as failed
or incorrect is **broken** and fails the gate; one the candidate lacks is **missing** (fails only with
fail_on_missing); one only the candidate has is **new**.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from moelab.gate.samples import Side, key_text
from moelab.gate.stats import FALLBACK_LEVEL, MWU_ALPHA, differ

OPS = ("layout", "dispatch", "dispatch_fresh", "combine", "roundtrip")
FAILING = ("regression", "broken")
STATUS_ORDER = ("broken", "regression", "missing", "inconclusive", "noise", "improvement", "new", "unchanged")


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    threshold: float = 0.05  # relative change of the median time
    alpha: float = MWU_ALPHA
    fallback_level: float = FALLBACK_LEVEL
    fail_on_missing: bool = False

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
    note: str = ""


@dataclass(kw_only=True, slots=True)
class GateResult:
    baseline: str  # how the baseline was found, for humans
    baseline_run: str
    candidate_run: str
    policy: Policy
    verdicts: list[Verdict] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for v in self.verdicts if v.status == status)

    @property
    def failing(self) -> list[Verdict]:
        bad = FAILING + (("missing",) if self.policy.fail_on_missing else ())
        return [v for v in self.verdicts if v.status in bad]

    @property
    def exit_code(self) -> int:
        return 1 if self.failing else 0

    def sorted(self) -> list[Verdict]:
        return sorted(self.verdicts, key=lambda v: (STATUS_ORDER.index(v.status), v.case, v.op or ""))


def compare_op(case: str, op: str, base: np.ndarray, cand: np.ndarray, policy: Policy) -> Verdict:
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
    )
    if abs(change) <= policy.threshold:
        return v
    test = differ(base, cand, policy.alpha, policy.fallback_level)
    if test.significant is None:
        note = f"too few samples to test ({base.size} and {cand.size}; 5 and 5 at least)"
        return replace(v, status="inconclusive", method=test.method, note=note)
    if not test.significant:
        return replace(
            v, status="noise", method=test.method, p_value=test.p_value, note="within the measured noise"
        )
    return replace(
        v, status="regression" if change > 0 else "improvement", method=test.method, p_value=test.p_value
    )


def decide(base: Side, cand: Side, policy: Policy, baseline: str) -> GateResult:
    result = GateResult(baseline=baseline, baseline_run=base.run_id, candidate_run=cand.run_id, policy=policy)
    for key, b in base.cases.items():
        text = key_text(key)
        c = cand.cases.get(key)
        if b.status != "ok":
            continue  # the baseline did not measure it: nothing to hold the candidate to
        if c is None:
            result.verdicts.append(
                Verdict(case=text, op=None, status="missing", note="not in the candidate run")
            )
            continue
        if c.status != "ok":
            broken = c.status in ("failed", "incorrect", "crashed", "timeout")
            result.verdicts.append(
                Verdict(
                    case=text,
                    op=None,
                    status="broken" if broken else "missing",
                    note=f"{c.status}: {c.reason or ''}".strip(),
                )
            )
            continue
        for op in OPS:
            if op in b.times and op in c.times:
                result.verdicts.append(compare_op(text, op, b.times[op], c.times[op], policy))
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
