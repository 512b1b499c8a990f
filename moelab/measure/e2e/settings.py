"""The e2e knobs of a case: which cases are e2e, which knobs the backend never sees, and the settings
the e2e case runs with (moelab.measure.e2e.bench), checked before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moelab.backends.base import CaseConfig
from moelab.core.errors import SpecError
from moelab.core.spec import CaseSpec
from moelab.core.workload import Workload
from moelab.measure.e2e.layer import GEMM_IMPLS, default_intermediate

BENCH_KNOB = "bench"
BENCH_E2E = "e2e"
E2E_KNOBS = (BENCH_KNOB, "mode", "chunks", "intermediate", "backward", "gemm", "profile", "carveout")
PROFILES = ("full", "layer")
MODES = ("serial", "tbo", "chunked")
OVERLAPPED = ("tbo", "chunked")
DEFAULT_CHUNKS = 4


def is_e2e(knobs: Mapping[str, Any]) -> bool:
    return knobs.get(BENCH_KNOB) == BENCH_E2E


def backend_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs meant for the backend: all but the e2e ones."""
    return {k: v for k, v in knobs.items() if k not in E2E_KNOBS}


def backend_case_config(case: CaseSpec) -> CaseConfig:
    """The CaseConfig a backend sees for `case` (e2e knobs removed; the same for non-e2e cases)."""
    return CaseConfig(
        case_id=case.case_id, workload=case.workload, sms=case.sms, knobs=backend_knobs(case.knobs)
    )


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"e2e knob {name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class E2ESettings:
    mode: str
    chunks: int  # 1 in serial mode
    intermediate: int
    backward: bool
    gemm: str  # as asked: auto / grouped / loop
    profile: str = "full"  # "layer": time the layer alone (moelab tune's early rounds)
    carveout: int = 0  # SMs the expert GEMMs leave free in the overlapped modes (moelab.measure.e2e.carveout)

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any], workload: Workload, sms: int | None = None) -> E2ESettings:
        """`sms` is the case's communication SM count: `carveout = "auto"` (the default) holds that many
        SMs back from the GEMMs of an overlapped layer (none when the SMs are the library's default)."""
        mode = knobs.get("mode", "serial")
        if mode == "overlap":
            raise SpecError("e2e mode overlap was renamed: use mode = tbo (two micro-batches) or chunked")
        if mode not in MODES:
            raise SpecError(f"e2e knob mode must be one of {', '.join(MODES)}, got {mode!r}")
        default_chunks = {"chunked": DEFAULT_CHUNKS, "tbo": 2}.get(mode, 1)
        chunks = _positive_int("chunks", knobs.get("chunks", default_chunks))
        if mode != "chunked" and chunks != default_chunks:
            raise SpecError(
                f"e2e knob chunks = {chunks} needs mode = chunked (serial runs one chunk, tbo two micro-batches)"
            )
        intermediate = _positive_int(
            "intermediate", knobs.get("intermediate", default_intermediate(workload.hidden))
        )
        backward = knobs.get("backward", False)
        if not isinstance(backward, bool):
            raise SpecError(f"e2e knob backward must be true or false, got {backward!r}")
        gemm = knobs.get("gemm", "auto")
        if gemm not in GEMM_IMPLS:
            raise SpecError(f"e2e knob gemm must be one of {', '.join(GEMM_IMPLS)}, got {gemm!r}")
        profile = knobs.get("profile", "full")
        if profile not in PROFILES:
            raise SpecError(f"e2e knob profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        return cls(
            mode=mode, chunks=chunks, intermediate=intermediate, backward=backward, gemm=gemm, profile=profile,
            carveout=resolve_carveout(knobs.get("carveout", "auto"), mode, sms),
        )  # fmt: skip

    def to_record(self, gemm: str) -> dict[str, Any]:
        """The settings as the backend record's `e2e` entry, with the GEMM implementation `auto` chose."""
        return {
            "mode": self.mode,
            "chunks": self.chunks,
            "intermediate": self.intermediate,
            "backward": self.backward,
            "gemm": gemm,
            "profile": self.profile,
            "carveout": self.carveout,
        }


def resolve_carveout(value: Any, mode: str, sms: int | None) -> int:
    """SMs held back from the GEMMs: `auto` is the case's communication SMs in an overlapped mode."""
    if value == "auto":
        return (sms or 0) if mode in OVERLAPPED else 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SpecError(f"e2e knob carveout must be auto or a number of SMs >= 0, got {value!r}")
    if value and mode not in OVERLAPPED:
        raise SpecError(
            f"e2e knob carveout = {value} needs mode = tbo or chunked (nothing runs beside serial GEMMs)"
        )
    return value
