"""Trials as moelab runs: each round's candidates become e2e cases of one RunSpec, executed and stored
by moelab.launch.runner.execute like any `moelab run` (one job per backend), labelled, and read back."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab.errors import SpecError
from moelab.launch.rundir import now_iso
from moelab.launch.runner import execute, new_run_id
from moelab.plan.spec import CaseSpec, HealthSpec, LaunchSpec, RunSpec, TimingSpec
from moelab.plan.workload import Workload
from moelab.store.db import open_db
from moelab.store.labels import set_label
from moelab.suites.loader import case_id_for
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
    launch: LaunchSpec
    runs_root: Path
    db_path: Path
    tune_id: str
    command: tuple[str, ...] = ()

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

    def case_for(self, c: Candidate, profile: str) -> CaseSpec:
        wl = self.workload_for(c.backend)
        knobs = self.knobs_for(c, profile)
        skip = None
        try:
            wl.validate(self.launch.world)
        except SpecError as exc:
            skip = str(exc)
        return CaseSpec(
            case_id=case_id_for(wl, c.sms, knobs),
            backend=c.backend,
            workload=wl,
            sms=c.sms,
            knobs=knobs,
            skip_reason=skip,
        )

    def round_label(self, n: int) -> str:
        return f"tune-{self.tune_id}-r{n}"


def run_round(
    plan: TrialPlan,
    n: int,
    candidates: Sequence[Candidate],
    timing: TimingSpec,
    progress: Callable[[str], None] = print,
) -> list[Trial]:
    """Time `candidates` as one stored run; one trial each, in the order given."""
    profile = "full" if n == ROUNDS else "layer"  # the final round records every figure of the winner
    cases = [plan.case_for(c, profile) for c in candidates]
    backends = tuple(dict.fromkeys(c.backend for c in candidates))
    label = plan.round_label(n)
    spec = RunSpec(
        run_id=new_run_id(), created_at=now_iso(), suite=SUITE_NAME, backends=backends, cases=tuple(cases),
        timing=timing, launch=plan.launch, label=label, command=plan.command,
        health=HealthSpec(snapshots=False),
    )  # fmt: skip
    progress(f"tune round {n}: {len(cases)} trials over {', '.join(backends)} (run {spec.run_id})")
    execute(spec, plan.runs_root, plan.db_path, progress=progress)
    with open_db(plan.db_path) as con:
        set_label(con, spec.run_id, label)
        rows = con.execute(
            """SELECT c.backend, c.case_id, c.status, c.reason, m.value
               FROM cases c LEFT JOIN case_metrics m
                 ON m.run_id = c.run_id AND m.backend = c.backend AND m.case_id = c.case_id AND m.name = ?
               WHERE c.run_id = ?""",
            [plan.objective, spec.run_id],
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
            )  # fmt: skip
        )
    return trials
