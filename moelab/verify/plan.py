"""The moelab side of a verification: one case per (backend, payload) at the library test's configuration.

`verify_spec` is the one place the RunSpec is built, so it can be swapped for the run planner when that
exists; everything else in verify reads cases back from the store by (backend, dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moelab.errors import SpecError
from moelab.plan.spec import CaseSpec, HealthSpec, LaunchSpec, RunSpec, TimingSpec, TraceSpec
from moelab.plan.workload import RoutingSpec, Workload
from moelab.suites.loader import case_id_for
from moelab.verify.parse_deepep import INTRANODE_SMS

VERIFY_BACKENDS = ("deepep", "deepep-ll", "hybrid-ep", "nccl-tests")
LIBRARY_DTYPES = ("bf16", "fp8")  # the payloads the libraries' tests print figures for


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyRequest:
    backends: tuple[str, ...]
    hidden: int
    tokens_per_rank: int
    topk: int
    experts_per_rank: int
    dtypes: tuple[str, ...]
    sms: int | None  # None: each library test's own SM count

    def validate(self) -> None:
        unknown = [b for b in self.backends if b not in VERIFY_BACKENDS]
        if unknown:
            raise SpecError(
                f"verify knows no backend {unknown[0]!r}: choose from {', '.join(VERIFY_BACKENDS)}"
            )
        if not self.backends:
            raise SpecError("--backend names no backend")
        bad = [d for d in self.dtypes if d not in LIBRARY_DTYPES]
        if bad or not self.dtypes:
            raise SpecError(
                f"verify compares payloads {', '.join(LIBRARY_DTYPES)} (what the libraries' tests print), got {bad or 'none'}"
            )
        if "deepep" in self.backends and self.sms not in (None, INTRANODE_SMS):
            raise SpecError(
                f"DeepEP's tests/test_intranode.py runs {INTRANODE_SMS} SMs only; give --sms {INTRANODE_SMS} or leave it out"
            )
        Workload(hidden=self.hidden, tokens_per_rank=self.tokens_per_rank, topk=self.topk,
                 experts_per_rank=self.experts_per_rank).validate()  # fmt: skip


def case_sms(backend: str, sms: int | None) -> int | None:
    """The SM count moelab's case runs: the one the library's test runs."""
    if backend == "deepep":
        return INTRANODE_SMS
    if backend == "hybrid-ep":
        return sms  # passed to the test as NUM_SMS_DISPATCH / NUM_SMS_COMBINE; None = both at defaults
    return None  # deepep-ll picks its own; nccl-tests has no SM control


def case_dtypes(backend: str, dtypes: tuple[str, ...]) -> tuple[str, ...]:
    """test_low_latency.py benchmarks FP8 dispatch only; the others print every payload asked for."""
    return ("fp8",) if backend == "deepep-ll" else dtypes


def library_way_knobs(backend: str) -> dict[str, Any]:
    """Knobs that make moelab's `dispatch` op time what the library's test times (a cached handle). Backends
    with the phase split time the cached payload as `dispatch` already; older ones need `handle = cached`."""
    if backend not in ("deepep", "hybrid-ep"):
        return {}
    from moelab.backends import registry

    return {} if getattr(registry.load(backend), "phases", False) else {"handle": "cached"}


def verify_cases(req: VerifyRequest, world: int) -> list[CaseSpec]:
    cases = []
    for backend in req.backends:
        for dtype in case_dtypes(backend, req.dtypes):
            wl = Workload(hidden=req.hidden, tokens_per_rank=req.tokens_per_rank, topk=req.topk,
                          experts_per_rank=req.experts_per_rank, routing=RoutingSpec(kind="uniform", seed=0), dtype=dtype)  # fmt: skip
            sms, knobs = case_sms(backend, req.sms), library_way_knobs(backend)
            skip = None
            try:
                wl.validate(world)
            except SpecError as exc:
                skip = str(exc)
            cases.append(CaseSpec(case_id=case_id_for(wl, sms, knobs), backend=backend, workload=wl, sms=sms,
                                  knobs=knobs, skip_reason=skip))  # fmt: skip
    return cases


def verify_spec(
    req: VerifyRequest, *, run_id: str, created_at: str, launch: LaunchSpec, timing: TimingSpec,
    trace: TraceSpec, health: HealthSpec, command: tuple[str, ...], label: str | None = None,
) -> RunSpec:  # fmt: skip
    return RunSpec(
        run_id=run_id, created_at=created_at, suite="verify", backends=req.backends,
        cases=tuple(verify_cases(req, launch.world)), timing=timing, launch=launch, label=label, command=command,
        trace=trace, health=health,
    )  # fmt: skip
