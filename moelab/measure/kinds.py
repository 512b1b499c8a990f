"""One runner per case kind, registered here: the worker looks a case's kind up and never branches on it.

A kind whose cases the ranks run maps to a function (CaseContext, CaseSpec) -> CaseRecord; the host-job
kind (nccl-tests: the launching host runs the whole job) has no rank-side runner.
"""

from __future__ import annotations

from collections.abc import Callable

from moelab.core.case_record import CaseRecord
from moelab.core.spec import CaseSpec
from moelab.measure.a2a_case import measure_case
from moelab.measure.case_context import CaseContext
from moelab.measure.e2e.bench import run_e2e_case

CaseRunner = Callable[[CaseContext, CaseSpec], CaseRecord]

RANK_RUNNERS: dict[str, CaseRunner] = {
    "a2a": measure_case,
    "e2e": run_e2e_case,
}


def run_case(cc: CaseContext, case: CaseSpec) -> CaseRecord:
    """One case on this rank by its kind's runner; returns the record (the same on every rank)."""
    runner = RANK_RUNNERS.get(case.kind)
    if runner is None:
        raise ValueError(f"case {case.case_id}: kind {case.kind!r} is not run by ranks")
    return runner(cc, case)
