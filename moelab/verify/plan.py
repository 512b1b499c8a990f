"""The moelab side of a verification: one case per (backend, payload) at the library test's configuration.

`run_request` turns it into a RunRequest with an inline suite; moelab.plan.planning.plan_run sizes the world
and checks sizes, knobs and flags as for `moelab run`. Everything else in verify reads cases back from the
store by (backend, dtype). What each library's test needs is its backend's `library_test`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moelab.backends import registry
from moelab.backends.library_test import LibraryTest, VerifyConfig
from moelab.core.errors import SpecError
from moelab.plan.planning import RunRequest
from moelab.suites.loader import Suite

LIBRARY_DTYPES = ("bf16", "fp8")  # the payloads the libraries' tests print figures for


def library_tests() -> dict[str, LibraryTest]:
    """Every backend whose class declares its library's own test, in the registry's order, with that test."""
    return {name: cls.library_test for name, cls in registry.declared() if cls.library_test is not None}


def library_test(backend: str) -> LibraryTest:
    """The library test of a backend verify knows (VerifyRequest.validate has checked the name)."""
    test = registry.load(backend).library_test
    if test is None:
        raise SpecError(f"verify knows no backend {backend!r}: it declares no library test")
    return test


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyRequest(VerifyConfig):
    backends: tuple[str, ...]

    def validate(self) -> None:
        """What only verify refuses; sizes and the rest are plan_run's."""
        known = library_tests()
        unknown = [b for b in self.backends if b not in known]
        if unknown:
            raise SpecError(f"verify knows no backend {unknown[0]!r}: choose from {', '.join(known)}")
        bad = [d for d in self.dtypes if d not in LIBRARY_DTYPES]
        if bad or not self.dtypes:
            raise SpecError(
                f"verify compares payloads {', '.join(LIBRARY_DTYPES)} (what the libraries' tests print), got {bad or 'none'}"
            )
        refusal = next((r for b in self.backends if (r := known[b].refuse(self))), None)
        if refusal:
            raise SpecError(refusal)


def case_sms(backend: str, config: VerifyConfig) -> int | None:
    """The SM count moelab's case runs: the one the library's test runs."""
    return library_test(backend).case_sms(config)


def case_dtypes(backend: str, config: VerifyConfig) -> tuple[str, ...]:
    """The payloads of moelab's cases: those the library's test prints figures for."""
    return library_test(backend).case_dtypes(config)


def library_way_knobs(backend: str) -> dict[str, Any]:
    """Knobs that make moelab's op time what the library's test times (e.g. along a cached handle)."""
    return dict(library_test(backend).case_knobs)


def verify_suite(req: VerifyRequest) -> Suite:
    """One case per (backend, payload), uniform routing with seed 0, each at the SMs and knobs of the library's
    test, in that order."""
    cases = tuple(
        {"backend": b, "dtype": d, "sms": case_sms(b, req), **library_way_knobs(b)}
        for b in req.backends
        for d in case_dtypes(b, req)
    )
    return Suite(
        name="verify",
        description="moelab's side of `moelab verify`",
        workload={"routing": "uniform", "seed": 0},
        axes={},
        cases=cases,
        source="moelab verify",
    )


def run_request(req: VerifyRequest, **flags: Any) -> RunRequest:
    """The run plan_run checks and sizes: the library test's configuration as explicit workload flags (never
    refitted to the world), with `flags` (ranks, timing, launch) as `moelab run` takes them."""
    workload = {
        "hidden": [req.hidden],
        "tokens_per_rank": [req.tokens_per_rank],
        "topk": [req.topk],
        "experts_per_rank": [req.experts_per_rank],
    }
    return RunRequest(backends=req.backends, suite=verify_suite(req), workload=workload, **flags)
