"""The case ids a suite expands to for the chosen backends and flags (`moelab run --list-cases`), so that
`--case ID` can be given one of them without running anything, each with what will happen to it: run,
skipped (the plan says why), or unsupported (the backend says why before any rank starts:
moelab.backends.base.Backend.planned_reason; what only a running rank can tell, such as the installed
library's build, still shows as "to run")."""

from __future__ import annotations

from collections.abc import Sequence

from moelab.core.spec import CaseSpec, LaunchSpec


def planned_unsupported(case: CaseSpec, launch: LaunchSpec) -> str | None:
    """The reason `case` will be recorded unsupported, known from the plan alone, or None."""
    from moelab.backends import registry
    from moelab.backends.base import Backend, CaseConfig, Placement

    try:
        cls = registry.load(case.backend)
    except Exception:  # a backend that does not load here is said by the availability check
        return None
    if not issubclass(cls, Backend):
        return None
    where = Placement.of(launch)
    if case.e2e is not None:  # the layer's schedule needs what the backend declares it can do
        from moelab.core.errors import SpecError
        from moelab.measure.e2e.schedules import schedule_reason

        try:
            reason = schedule_reason(
                cls, case.e2e.resolve(case.workload, case.sms), where.comm_backend, case.workload.hidden
            )
        except SpecError as exc:  # bad settings are refused at planning; say so here too
            reason = str(exc)
        if reason:
            return reason
    return cls.planned_reason(CaseConfig.of(case), where)


NOT_RUN = "not run"  # the kind of a case the plan knows will be skipped or recorded unsupported


def planned_kind(case: CaseSpec, launch: LaunchSpec) -> str:
    """What a case will cost, as the progress estimate groups cases: its kind (a2a, e2e, host), or NOT_RUN
    when the plan already knows it will not run (it then takes no time)."""
    if case.skip_reason or planned_unsupported(case, launch):
        return NOT_RUN
    return case.kind


def plan_text(case: CaseSpec, launch: LaunchSpec | None) -> str:
    if case.skip_reason:
        return f"skipped: {case.skip_reason}"
    reason = planned_unsupported(case, launch) if launch is not None else None
    return f"unsupported: {reason}" if reason else "to run"


def case_rows(cases: Sequence[CaseSpec], launch: LaunchSpec | None = None) -> list[tuple[str, str, str, str]]:
    """(backend, case id, workload, what happens to it) per case, in suite order; with the launch, the
    cases its backend will record unsupported say so and why."""
    rows = []
    for c in cases:
        wl = c.workload
        workload = (
            f"hidden {wl.hidden}, {wl.tokens_per_rank} tokens/rank, topk {wl.topk}, {wl.experts_per_rank} experts/rank, "
            f"{wl.routing.kind}, {wl.dtype}, SMs {c.sms if c.sms is not None else 'default'}"
        )
        rows.append((c.backend, c.case_id, workload, plan_text(c, launch)))
    return rows
