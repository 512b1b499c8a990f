"""The moelab side of a verification: one case per (backend, payload) at the library test's configuration.

`run_request` turns it into a RunRequest with an inline suite; moelab.plan.planning.plan_run sizes the world
and checks sizes, knobs and flags as for `moelab run`. Everything else in verify reads cases back from the
store by (backend, dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moelab.core.errors import SpecError
from moelab.plan.planning import RunRequest
from moelab.suites.loader import Suite
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
        """What only verify refuses; sizes and the rest are plan_run's."""
        unknown = [b for b in self.backends if b not in VERIFY_BACKENDS]
        if unknown:
            raise SpecError(
                f"verify knows no backend {unknown[0]!r}: choose from {', '.join(VERIFY_BACKENDS)}"
            )
        bad = [d for d in self.dtypes if d not in LIBRARY_DTYPES]
        if bad or not self.dtypes:
            raise SpecError(
                f"verify compares payloads {', '.join(LIBRARY_DTYPES)} (what the libraries' tests print), got {bad or 'none'}"
            )
        if "deepep" in self.backends and self.sms not in (None, INTRANODE_SMS):
            raise SpecError(
                f"DeepEP's tests/test_intranode.py runs {INTRANODE_SMS} SMs only; give --sms {INTRANODE_SMS} or leave it out"
            )


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


def verify_suite(req: VerifyRequest) -> Suite:
    """One case per (backend, payload), uniform routing with seed 0, each at the SMs and knobs of the library's
    test, in that order."""
    cases = tuple({"backend": b, "dtype": d, "sms": case_sms(b, req.sms), **library_way_knobs(b)}
                  for b in req.backends for d in case_dtypes(b, req.dtypes))  # fmt: skip
    return Suite(name="verify", description="moelab's side of `moelab verify`", workload={"routing": "uniform", "seed": 0},
                 axes={}, cases=cases, source="moelab verify")  # fmt: skip


def run_request(req: VerifyRequest, **flags: Any) -> RunRequest:
    """The run plan_run checks and sizes: the library test's configuration as explicit workload flags (never
    refitted to the world), with `flags` (ranks, timing, launch) as `moelab run` takes them."""
    workload = {"hidden": [req.hidden], "tokens_per_rank": [req.tokens_per_rank], "topk": [req.topk],
                "experts_per_rank": [req.experts_per_rank]}  # fmt: skip
    return RunRequest(backends=req.backends, suite=verify_suite(req), workload=workload, **flags)
