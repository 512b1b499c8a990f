"""Trials as moelab runs: each round's candidates become e2e cases of one RunSpec, planned by
moelab.plan.planning.plan_run as `moelab run` is (the world, sizes, knobs and label checked there), executed
and stored by moelab.launch.runner.execute (one job per backend), labelled, and read back."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab.core.errors import SpecError
from moelab.core.spec import LaunchSpec, RunSpec, TimingSpec
from moelab.core.workload import Workload
from moelab.launch.runner import execute, new_run_id
from moelab.plan.case_list import planned_unsupported
from moelab.plan.planning import HostFacts, RunRequest, plan_run
from moelab.store.db import open_db
from moelab.store.labels import set_label
from moelab.suites.loader import Suite
from moelab.tune.search import ROUNDS, Trial
from moelab.tune.space import Candidate

SUITE_NAME = "tune"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialPlan:
    """Everything a round needs besides its candidates."""

    workload: Workload  # the payload dtype here is the default; `dtypes` overrides it per backend
    dtypes: Mapping[str, str]
    intermediate: int
    backward: bool
    launch: LaunchSpec  # as plan_run sized it (plan_trials); every round plans it again from `request`
    runs_root: Path
    db_path: Path
    tune_id: str
    request: RunRequest = field(default_factory=RunRequest)  # the user's launch flags (ranks, paths, timeout)
    host: HostFacts = field(default_factory=HostFacts)

    @property
    def objective(self) -> str:
        return "tokens_per_s_per_rank_fwd_bwd" if self.backward else "tokens_per_s_per_rank"

    def workload_for(self, backend: str) -> Workload:
        return dataclasses.replace(self.workload, dtype=self.dtypes.get(backend, self.workload.dtype))

    def knobs_for(self, c: Candidate, profile: str) -> dict[str, Any]:
        knobs: dict[str, Any] = {"bench": "e2e", "mode": c.mode, "intermediate": self.intermediate}
        if self.backward:
            knobs["backward"] = True
        if profile != "full":
            knobs["profile"] = profile
        return knobs | c.knob_dict()

    def round_label(self, n: int) -> str:
        return f"tune-{self.tune_id}-r{n}"

    def spec_for(self, n: int, candidates: Sequence[Candidate], timing: TimingSpec) -> RunSpec:
        """Round `n` as plan_run checks it: one e2e case per candidate, in their order."""
        profile = "full" if n == ROUNDS else "layer"  # the final round records every figure of the winner
        wl = self.workload
        cases = tuple(
            {
                "backend": c.backend,
                "dtype": self.workload_for(c.backend).dtype,
                "sms": c.sms,
                **self.knobs_for(c, profile),
            }
            for c in candidates
        )
        req = dataclasses.replace(
            self.request,
            backends=tuple(dict.fromkeys(c.backend for c in candidates)),
            suite=Suite(
                name=SUITE_NAME,
                description=f"moelab tune {self.tune_id}",
                workload={},
                axes={},
                cases=cases,
                source=f"moelab tune round {n}",
            ),
            workload={
                "hidden": [wl.hidden],
                "tokens_per_rank": [wl.tokens_per_rank],
                "topk": [wl.topk],
                "experts_per_rank": [wl.experts_per_rank],
                "routing": [wl.routing.kind],
                "seed": [wl.routing.seed],
            },
            iters=timing.iters,
            warmup=timing.warmup,
            label=self.round_label(n),
            health=False,
            # only the final round's verdict needs repeats
            repeat=self.request.repeat if n == ROUNDS else None,
        )
        return plan_run(req, self.host, new_run_id=new_run_id()).spec


def plan_trials(
    *,
    request: RunRequest,
    host: HostFacts,
    workload: Workload,
    dtypes: Mapping[str, str],
    intermediate: int,
    backward: bool,
    first: Sequence[Candidate],
    final: TimingSpec,
    runs_root: Path,
    db_path: Path,
    tune_id: str,
) -> TrialPlan:
    """The plan with its launch as plan_run sizes it: round one's candidates (`first`) at the final round's
    settings planned once, so any user error is refused here, before anything runs."""
    draft = TrialPlan(
        workload=workload,
        dtypes=dtypes,
        intermediate=intermediate,
        backward=backward,
        launch=LaunchSpec(),
        runs_root=runs_root,
        db_path=db_path,
        tune_id=tune_id,
        request=request,
        host=host,
    )
    spec = draft.spec_for(ROUNDS, first, final)
    refuse_if_none_can_run(spec)
    return dataclasses.replace(draft, launch=spec.launch)


def refuse_if_none_can_run(spec: RunSpec) -> None:
    """Refuse a search whose every first-round trial a backend rules out from the plan alone (`--hidden 63
    --dtype mxfp8`): that was found only after a whole round had started ranks and stored nothing."""
    reasons: dict[str, str] = {}
    for case in spec.cases:
        reason = planned_unsupported(case, spec.launch)
        if reason is None:
            return
        reasons.setdefault(case.backend, reason)
    said = "; ".join(f"{backend}: {reason}" for backend, reason in reasons.items())
    raise SpecError(f"tune: no trial can run at this shape ({said})")


class TuneInterrupted(Exception):
    """A round stopped by SIGINT or SIGTERM (its finished trials stored): the search ends there, rather than
    going on to the next round as if the user had not asked to stop, or calling the stopped trials failed."""

    def __init__(self, signal_name: str, run_id: str) -> None:
        super().__init__(f"tune stopped by {signal_name} in run {run_id}: its finished trials are stored")
        self.signal_name = signal_name


def run_round(
    plan: TrialPlan,
    n: int,
    candidates: Sequence[Candidate],
    timing: TimingSpec,
    progress: Callable[[str], None] = print,
) -> list[Trial]:
    """Time `candidates` as one stored run; one trial each, in the order given."""
    spec = plan.spec_for(n, candidates, timing)
    cases, backends, label = spec.cases, spec.backends, plan.round_label(n)
    progress(f"tune round {n}: {len(cases)} trials over {', '.join(backends)} (run {spec.run_id})")
    outcome = execute(spec, plan.runs_root, plan.db_path, progress=progress)
    with open_db(plan.db_path) as con:
        set_label(con, spec.run_id, label)
    if outcome.interrupted_by:
        raise TuneInterrupted(outcome.interrupted_by, spec.run_id)
    with open_db(plan.db_path) as con:
        rows = con.execute(
            """SELECT c.backend, c.case_id, c.status, c.reason, m.value,
                      (SELECT list(p.value ORDER BY p.repeat) FROM process_metrics p WHERE p.run_id = c.run_id
                         AND p.backend = c.backend AND p.case_id = c.case_id AND p.name = ?)
               FROM cases c LEFT JOIN case_metrics m
                 ON m.run_id = c.run_id AND m.backend = c.backend AND m.case_id = c.case_id AND m.name = ?
               WHERE c.run_id = ?""",
            [plan.objective, plan.objective, spec.run_id],
        ).fetchall()
    found = {(r[0], r[1]): r for r in rows}
    trials = []
    for cand, case in zip(candidates, cases, strict=True):
        row = found.get((case.backend, case.case_id))
        status, reason, value = (
            (row[2], row[3], row[4]) if row else ("crashed", "no record: the job died", None)
        )
        trials.append(
            Trial(
                round=n,
                candidate=cand,
                run_id=spec.run_id,
                case_id=case.case_id,
                status=status,
                tokens_per_s=float(value) if value is not None else None,
                reason=reason,
                per_start=tuple(float(v) for v in (row[5] or ()) if v is not None) if row else (),
            )
        )
    return trials
