"""What is judged of a run once it is stored: spread against the case's history and the noise target,
and run-to-run drift of each op's median. One entry point, so `moelab run` and `moelab ingest` agree.

The rules are pure: moelab.store.run_history reads the history they need and calls `judgments`; the
Judgment rows go to a table of their own (moelab.store.judgments: a measured row is never rewritten;
views join the two for readers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moelab.health.drift import Drift
from moelab.health.spread import SpreadFlag

VERDICTS = ("suspect", "unstable")  # suspect: a case's figures; unstable: one op's median


@dataclass(frozen=True, kw_only=True, slots=True)
class Judgment:
    """One verdict on a stored case or op, made while judging run `judged_by` (it may be about an earlier
    run: drift marks both runs, each naming the other)."""

    run_id: str
    backend: str
    case_id: str
    op: str | None  # None: the case as a whole
    verdict: str  # one of VERDICTS
    rule: str  # spread, drift
    reason: str
    other_run: str | None = None
    judged_by: str


def judgments(run_id: str, spreads: Sequence[SpreadFlag], drifts: Sequence[Drift]) -> list[Judgment]:
    """Every judgment of `run_id` from its spread and drift flags, in the order they read best."""
    out: list[Judgment] = []
    for f in spreads:
        out.append(
            Judgment(
                run_id=run_id,
                backend=f.backend,
                case_id=f.case_id,
                op=None,
                verdict="suspect",
                rule="spread",
                reason=f.reason(),
                judged_by=run_id,
            )
        )
    for d in drifts:
        new = d.reason(d.previous_run, d.change)
        old = d.reason(run_id, d.previous_median_us / d.median_us - 1.0)
        where = {"backend": d.backend, "case_id": d.case_id, "rule": "drift", "judged_by": run_id}
        out += [
            Judgment(
                run_id=run_id, op=d.op, verdict="unstable", reason=new, other_run=d.previous_run, **where
            ),
            Judgment(
                run_id=d.previous_run, op=d.op, verdict="unstable", reason=old, other_run=run_id, **where
            ),
            Judgment(
                run_id=run_id,
                op=None,
                verdict="suspect",
                reason=f"drift: {d.op} {new}",
                other_run=d.previous_run,
                **where,
            ),
        ]
    return out
