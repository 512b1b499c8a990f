"""The e2e layer's settings, twice typed: as a suite or `moelab tune` asked for them (E2ESpec, carried by the
case spec: None is "the default"), and resolved against the case's workload and SMs (E2ESettings, what the
layer runs with). Every check is here, so a bad value is refused at planning with the same words wherever
it was written.

Suites ask for an e2e case with the backend axis `bench = "e2e"` and the knobs named in E2E_KEYS
(`bench = ["a2a", "e2e"]` gives both kinds in one job per backend: the e2e knobs apply to the e2e cases
only, so the dispatch/combine cases are the same whatever they cross with); the case
spec keeps them apart from the backend's own knobs (`CaseSpec.kind`, `CaseSpec.e2e`), and writes them back
in that form (`CaseSpec.asked_knobs`), so case ids and stored knobs read as they always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from moelab.core.errors import SpecError
from moelab.core.workload import LIMITS, MAX_SMS, Workload

BENCH_KNOB = "bench"  # the suite axis that makes a case an e2e case
BENCH_E2E = "e2e"
BENCH_A2A = "a2a"  # dispatch/combine, as a case without the axis: a suite crossing both runs them in one job
BENCHES = (BENCH_A2A, BENCH_E2E)
LAYER_OPS = ("layer", "layer_fwd_bwd")  # an e2e case's answer: the layer's time; its other ops explain it
LAYER_NAME = "MoE layer"  # how rankings name an e2e case's rows, kept apart from dispatch/combine's


def bench_of(knobs: Mapping[str, Any] | None) -> str:
    """The benchmark a stored case ran (its `bench` knob; none is dispatch/combine). A suite crossing both
    stores them side by side at one workload; the dispatch inside a layer is never a rival of a standalone
    one, so rankings keep the two apart."""
    return str((knobs or {}).get(BENCH_KNOB) or BENCH_A2A)


E2E_KEYS = ("mode", "chunks", "intermediate", "backward", "gemm", "profile", "carveout", "comm")
MODES = ("serial", "tbo", "chunked", "expert", "columns", "auto")
# auto: each rank times serial and the overlapped candidates (moelab.measure.e2e.auto_schedule) on the
# case's own rows before the check and runs the fastest, so the layer is never slower than serial
OVERLAPPED = ("tbo", "chunked", "expert", "columns", "auto")
# how an overlapped case timed its serial baseline, as its record says (e2e.serial_timing): iteration by
# iteration beside the schedule's (moelab.measure.timing.Clock.sample_interleaved); the report pairs them
SERIAL_TIMING = "interleaved"
CHUNKED_MODES = ("chunked", "expert", "columns")  # the modes whose `chunks` is a choice (tbo: two)
COLUMN_ALIGN = 8  # mode columns slices the hidden size in multiples of 8 (16-byte bf16 rows) at least
# Where the overlapped schedules' communication runs (moelab.measure.e2e.schedules says what each needs):
# shared: beside the GEMMs on whatever SMs its kernels take; priority: the same, its stream at the
# device's highest priority (a communication kernel launched under a GEMM of many blocks gets the SMs as
# the GEMM's running blocks finish, not after its last block has started); partition: on a fixed SM
# partition (the backend's SM count, the GEMMs held to the rest); zero-sm: on no SM (NCCL's zero-CTA
# copy-engine path); hook: the receive deferred to a hook called just before the data is needed (DeepEP
# return_recv_hook)
COMMS = ("shared", "priority", "partition", "zero-sm", "hook")
NO_SM_COMMS = ("zero-sm", "hook")  # the communication holds no SM while the GEMMs run: no carve-out
PROFILES = ("full", "layer")
GEMM_IMPLS = ("auto", "grouped", "grouped-wide", "triton", "padded", "loop")
# torch._grouped_mm's CUTLASS tiles on SM90, by the schedule word in the kernel's name: how the record and
# the report name the tile a GEMM ran (moelab.measure.e2e.gemm_choice.gemm_kernels)
GEMM_TILES = {
    "Pingpong": "64x128x128 ping-pong",
    "Cooperative": "128x256x64 cooperative",
    "triton_grouped_gemm": "Triton, tile tuned per shape (the record's gemm_triton_tiles)",
}
DEFAULT_CHUNKS = 4
INTERMEDIATE_DIVISOR = 4


def a2a_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """A case's knobs as asked, with `bench = "a2a"` said the way a dispatch/combine case is written: no
    bench and none of the layer's knobs (they are the e2e cases' of the same axes), so its id and stored
    knobs are those of the same case in a suite without the axis."""
    if knobs.get(BENCH_KNOB) != BENCH_A2A:
        return dict(knobs)
    return {k: v for k, v in knobs.items() if k != BENCH_KNOB and k not in E2E_KEYS}


def default_intermediate(hidden: int) -> int:
    return max(hidden // INTERMEDIATE_DIVISOR, 1)


# the largest chunk count and FFN width a layer is planned with (a width past the largest hidden size was
# accepted, and every job of a tune round then failed)
MAX_CHUNKS = 1024
MAX_INTERMEDIATE = LIMITS["hidden"]


def _positive_int(name: str, value: Any, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"e2e knob {name} must be a positive integer, got {value!r}")
    if value > limit:
        raise SpecError(f"e2e knob {name} {value} is above the largest supported, {limit:,}")
    return value


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"e2e knob {name} must be one of {', '.join(allowed)}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class E2ESettings:
    """The settings an e2e case runs with (moelab.measure.e2e)."""

    mode: str
    chunks: int  # 1 in serial mode
    intermediate: int
    backward: bool
    gemm: str  # as asked: auto / grouped / grouped-wide / triton / padded / loop
    profile: str = "full"  # "layer": time the layer alone (moelab tune's early rounds)
    carveout: int = 0  # SMs the expert GEMMs leave free in the overlapped modes (moelab.measure.e2e.carveout)
    comm: str = "shared"  # where the communication runs (COMMS)
    asked_mode: str = ""  # "auto" once auto_schedule chose `mode` for it

    @property
    def schedule(self) -> str:
        """The schedule's name as reports show it: the mode, its chunks where it has a choice, and where the
        communication runs when not shared (`tbo`, `chunked/4`, `expert/4+partition`, `auto:tbo`)."""
        name = f"{self.mode}/{self.chunks}" if self.mode in CHUNKED_MODES else self.mode
        name = name if self.comm == "shared" or self.mode == "serial" else f"{name}+{self.comm}"
        return f"auto:{name}" if self.asked_mode == "auto" else name

    @property
    def compares_serial(self) -> bool:
        """The case times the serial layer beside its own (an overlapped mode, or auto whatever it chose)."""
        return self.mode in OVERLAPPED or self.asked_mode == "auto"

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
            "comm": self.comm,
            "schedule": self.schedule,
        } | ({"asked_mode": self.asked_mode} if self.asked_mode else {})


@dataclass(frozen=True, kw_only=True, slots=True)
class E2ESpec:
    """The e2e knobs a case was given (None: not given, the default applies); each value checked here."""

    mode: str | None = None
    chunks: int | None = None
    intermediate: int | None = None
    backward: bool | None = None
    gemm: str | None = None
    profile: str | None = None
    carveout: int | str | None = None  # "auto" or SMs
    comm: str | None = None

    def __post_init__(self) -> None:
        if self.mode == "overlap":
            raise SpecError("e2e mode overlap was renamed: use mode = tbo (two micro-batches) or chunked")
        if self.mode is not None:
            _one_of("mode", self.mode, MODES)
        if self.chunks is not None:
            _positive_int("chunks", self.chunks, MAX_CHUNKS)
        if self.intermediate is not None:
            _positive_int("intermediate", self.intermediate, MAX_INTERMEDIATE)
        if self.backward is not None and not isinstance(self.backward, bool):
            raise SpecError(f"e2e knob backward must be true or false, got {self.backward!r}")
        if self.gemm is not None:
            _one_of("gemm", self.gemm, GEMM_IMPLS)
        if self.profile is not None:
            _one_of("profile", self.profile, PROFILES)
        c = self.carveout
        if (
            c is not None
            and c != "auto"
            and (not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= MAX_SMS)
        ):
            raise SpecError(
                f"e2e knob carveout must be auto or a number of SMs from 0 to {MAX_SMS:,}, got {c!r}"
            )
        if self.comm is not None:
            _one_of("comm", self.comm, COMMS)

    def combination_reason(self, sms: int | None) -> str | None:
        """Why these knobs, each valid, make no schedule together at `sms` (the product of a suite's axes:
        serial beside a `comm`, a partition at the library's default SMs): the suite loader skips such a
        case with this reason rather than refusing the suite."""
        comm = self.comm or "shared"
        if comm != "shared" and (self.mode or "serial") not in OVERLAPPED:
            return f"e2e comm = {comm} needs an overlapped mode: serial runs nothing beside its communication"
        if comm == "partition" and sms is None:
            return "e2e comm = partition needs sms = N (the communication's share); the case has the default"
        return None

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any]) -> E2ESpec:
        """The e2e knobs among `knobs` (the others are the backend's)."""
        return cls(**{k: knobs[k] for k in E2E_KEYS if k in knobs})

    def to_knobs(self) -> dict[str, Any]:
        """The knobs as given, in E2E_KEYS order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def resolve(self, workload: Workload, sms: int | None = None) -> E2ESettings:
        """The settings for a case of `workload` at `sms` communication SMs: `carveout = "auto"` (the
        default) holds that many SMs back from the GEMMs of an overlapped layer (none at the library's
        default SMs)."""
        mode = self.mode or "serial"
        default_chunks = DEFAULT_CHUNKS if mode in CHUNKED_MODES else {"tbo": 2}.get(mode, 1)  # auto: 1
        chunks = self.chunks if self.chunks is not None else default_chunks
        if mode not in CHUNKED_MODES and chunks != default_chunks:
            raise SpecError(
                f"e2e knob chunks = {chunks} needs mode = chunked, expert or columns (serial runs one chunk, "
                "tbo two micro-batches)"
            )
        if mode == "expert":
            chunks = min(chunks, workload.experts_per_rank)  # a group holds at least one expert
        if mode == "columns":  # a slice holds at least one aligned run of columns
            chunks = max(1, min(chunks, workload.hidden // COLUMN_ALIGN))
        comm = self.comm or "shared"
        if comm != "shared" and mode not in OVERLAPPED:
            raise SpecError(
                f"e2e knob comm = {comm} needs an overlapped mode ({', '.join(OVERLAPPED)}): serial runs "
                "nothing beside its communication"
            )
        if comm == "partition" and sms is None:
            raise SpecError(
                "e2e knob comm = partition needs sms = N: the SMs the communication is held to (the GEMMs "
                "get the rest)"
            )
        carveout = self.carveout if self.carveout is not None else "auto"
        if carveout == "auto" and comm in NO_SM_COMMS:
            carveout = 0  # the communication holds no SM while the GEMMs run
        return E2ESettings(
            mode=mode,
            chunks=chunks,
            intermediate=self.intermediate or default_intermediate(workload.hidden),
            backward=bool(self.backward),
            gemm=self.gemm or "auto",
            profile=self.profile or "full",
            carveout=resolve_carveout(carveout, mode, sms),
            comm=comm,
        )


def resolve_carveout(value: int | str, mode: str, sms: int | None) -> int:
    """SMs held back from the GEMMs: `auto` is the case's communication SMs in an overlapped mode."""
    if value == "auto":
        return (sms or 0) if mode in OVERLAPPED else 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SpecError(f"e2e knob carveout must be auto or a number of SMs >= 0, got {value!r}")
    if value and mode not in OVERLAPPED:
        raise SpecError(
            f"e2e knob carveout = {value} needs an overlapped mode, {', '.join(OVERLAPPED)} (nothing runs "
            "beside serial GEMMs)"
        )
    return value
