"""The backend protocol: one small class per library, made once per job, used for every case of the job.

A backend receives its rank's tokens and routing and returns what the reference semantics
(moelab.measure.reference) says: the tokens this rank must receive, with local expert ids and weights, and,
in combine, the rows sent back and summed at their source.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from moelab.backends.capabilities import LibraryFigures
from moelab.backends.knobs import Knobs
from moelab.core.workload import Workload, payload_bytes_per_token

if TYPE_CHECKING:
    from moelab.backends.library_test import LibraryTest
    from moelab.backends.tuning import TuneSpace
    from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec
    from moelab.job.local import JobOutcome
    from moelab.job.rundir import JobFiles


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendContext:
    """Where a backend runs: this rank, the world, the device and the process group."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    group: Any  # torch.distributed.ProcessGroup; Any keeps this importable without a process group
    gpus_per_node: int
    comm_backend: str  # "nccl" or "gloo"
    kernel_cache: Path | None = None  # where JIT-compiling backends keep kernels across jobs (None: never)

    @property
    def node(self) -> int:
        return self.rank // self.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return -(-self.world // self.gpus_per_node)


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Where a backend's ranks run, as known before any of them starts: what `planned_reason` may use."""

    world: int
    gpus_per_node: int
    comm_backend: str  # "nccl" or "gloo"

    @classmethod
    def of(cls, where: BackendContext | LaunchSpec) -> Placement:
        """A running rank's placement, or a planned launch's (CUDA ranks talk NCCL, CPU ranks gloo)."""
        if isinstance(where, BackendContext):
            return cls(world=where.world, gpus_per_node=where.gpus_per_node, comm_backend=where.comm_backend)
        comm = "nccl" if where.device == "cuda" else "gloo"
        return cls(world=where.world, gpus_per_node=where.gpus_per_node, comm_backend=comm)


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseConfig:
    """What a backend needs to know about one case."""

    case_id: str
    workload: Workload
    sms: int | None = None  # None: the library's default
    knobs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, case: CaseSpec) -> CaseConfig:
        """What the backend sees of `case`: its workload, SMs and the backend's own knobs."""
        return cls(case_id=case.case_id, workload=case.workload, sms=case.sms, knobs=dict(case.knobs))


@dataclass(slots=True)
class Dispatched:
    """What dispatch delivered to this rank. Row order is the backend's own."""

    recv_x: torch.Tensor  # [R, H]: bf16, fp8 (with recv_scales) or already dequantized
    recv_topk_idx: torch.Tensor  # [R, K] local expert ids, -1 where the expert lives elsewhere
    recv_topk_weights: torch.Tensor  # [R, K]
    handle: Any  # whatever combine needs
    recv_scales: torch.Tensor | None = None  # fp8: [R, H/128] float32 per-128 scales (DeepEP layout)
    # each local expert's received (row, slot) pairs, where the library read them on the host (HostExpertCounts)
    recv_expert_counts: tuple[int, ...] | None = None

    @property
    def num_rows(self) -> int:
        return int(self.recv_x.shape[0])

    def recv_x_float(self) -> torch.Tensor:
        """The received payload as float32, dequantized where it came as fp8 with per-128 scales."""
        x = self.recv_x.float()
        if self.recv_scales is None:
            return x
        rows, hidden = x.shape
        scales = self.recv_scales.float()
        block = hidden // scales.shape[1]
        return (x.view(rows, -1, block) * scales.unsqueeze(-1)).view(rows, hidden)


@dataclass(frozen=True, slots=True)
class SourceBuild:
    """How a library given as its source tree (--backend-path NAME=TREE) is built in place: a tree that
    holds `package` and `marker` but none of `built` (globs of its compiled extension) is not built yet,
    and `step` run in it builds it."""

    package: str  # the Python package the tree holds (TREE/<package>/)
    built: tuple[str, ...]  # globs under TREE of the compiled extension; any one found: built
    step: str  # the build command, run in TREE
    marker: str = "setup.py"  # what makes TREE a source tree of the library (not an install)

    def unbuilt(self, tree: Path) -> str | None:
        """One line naming the build step when `tree` is the library's source, not built; else None."""
        if not (tree / self.package).is_dir() or not (tree / self.marker).is_file():
            return None
        if any(next(tree.glob(g), None) is not None for g in self.built):
            return None
        return (
            f"{tree} holds {self.package}'s source but not its compiled library ({' or '.join(self.built)}): "
            f"run `{self.step}` in {tree}"
        )


class Registered(abc.ABC):
    """What the registry holds under a backend name: a Backend (moelab's ranks run it) or a HostJob (the
    launching host runs a tool that launches the GPUs itself). Both are planned alike: cases, knobs,
    availability; and either may declare how its library's own test verifies it (`moelab verify`)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    knobs: ClassVar[type[Knobs]] = Knobs  # its knobs as one typed config; validated before anything launches
    library_test: ClassVar[LibraryTest | None] = None  # the library's own benchmark, for `moelab verify`
    # how its dispatch moves rows, for moelab model's bound (moelab.model.traffic.FAMILIES): "flat" (one
    # copy per (token, rank)), "hierarchical" (one RDMA copy per (token, node), then NVLink forwarding) or
    # "low_latency" (one message per (token, expert)); None: not said, bound by the fastest family
    dispatch_family: ClassVar[str | None] = None
    dispatch_family_source: ClassVar[str] = ""  # where the family is stated (the library's own documents)
    # how its library is built from the source tree given with --backend-path (None: nothing to build)
    source_build: ClassVar[SourceBuild | None] = None

    @classmethod
    def unbuilt(cls, tree: Path) -> str | None:
        """Why the library in `tree` (--backend-path) cannot load: its source not built yet, naming the
        build step; None otherwise. Cheap (files only), so it is said before any import or GPU check."""
        return cls.source_build.unbuilt(tree) if cls.source_build is not None else None

    @classmethod
    def stored_combine_dtype(cls, knobs: Mapping[str, Any]) -> str:
        """Combine's payload type for a case with these knobs (bf16 unless the backend quantizes it)."""
        return "bf16"

    @classmethod
    def check_knobs(cls, knobs: Mapping[str, Any], workload: Workload) -> None:
        """Raise SpecError for an unknown knob or a bad value (a user error, refused before anything
        launches); a valid setting the library cannot run is unsupported_reason's, stored per case."""
        cls.knobs.parse(knobs, cls.name).check(workload)

    @classmethod
    def availability(cls) -> str | None:
        """None when the backend can run on this host, else the reason in one line. Cheap: no kernels."""
        return None

    @classmethod
    def availability_for(cls, launch: LaunchSpec) -> str | None:
        """availability() for a run launched as `launch` (a backend whose tool path is a launch setting)."""
        return cls.availability()


class HostJob(Registered):
    """A backend whose whole job the launching host runs (an external binary that launches the GPUs
    itself): no moelab ranks, so no dispatch or combine. Its results are the tool's own timing (one
    figure per size), which health's drift and spread checks of moelab's samples leave out."""

    @classmethod
    @abc.abstractmethod
    def run_job(cls, spec: RunSpec, files: JobFiles) -> JobOutcome:
        """Run the job of `spec` for this backend: one CaseRecord per case into `files`, the job's outcome
        returned (and written to `files`)."""


class Backend(Registered):
    """Subclass, set `name`, and register under the entry-point group `moelab.backends`.

    A backend that can run the routing/layout step on its own sets `phases = True` and implements
    `layout()`; `dispatch(..., layout=L)` then moves only the payload. Without it, dispatch is timed whole
    (ops `dispatch_fresh`, `combine`, `roundtrip`) and the record says the phases were not split.
    More it may do is declared by subclassing the protocols of moelab.backends.capabilities.
    """

    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control: ClassVar[str | None] = None  # how --sms maps to the library, None when it cannot
    phases: ClassVar[bool] = False  # implements layout() and dispatch(..., layout=...)
    # compiles its kernels on the first call of each new configuration (a JIT): each case's correctness
    # check, its first call, is then timed as the one-time cost "jit" rather than hidden in the job's time
    compiles_on_first_call: ClassVar[bool] = False
    # what `moelab tune` varies beyond schedules and SMs, and the settings it prints for a winner
    tuning: ClassVar[TuneSpace | None] = None

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        """Make buffers and communicators once per job, sized for the largest of `cases`."""
        self.ctx = ctx

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        """Why the library cannot run this case, from what is known before any rank starts (the case and
        where it is placed); `moelab run --list-cases` shows it. Ranks ask unsupported_reason, which adds
        what only a running rank knows (the library build, the device)."""
        if case.workload.dtype not in cls.payload_dtypes:
            return f"{cls.name} has no {case.workload.dtype} dispatch payload (has {', '.join(cls.payload_dtypes)})"
        if case.sms is not None and cls.sm_control is None:
            return f"{cls.name} has no SM control here; run it with sms = default"
        return None

    def unsupported_reason(self, case: CaseConfig) -> str | None:
        """Host-side check for configurations the library cannot run (it may trap on the device)."""
        return type(self).planned_reason(case, Placement.of(self.ctx))

    def prepare(self, case: CaseConfig) -> None:  # noqa: B027 - optional hook
        """Apply per-case settings (SM count, knobs) before the case runs."""

    def library_timed_ops(self) -> tuple[str, ...]:
        """The ops of the prepared case that its library's own test times (library_ops of a backend with
        LibraryFigures, unless a knob took the case off that path)."""
        return type(self).library_ops if isinstance(self, LibraryFigures) else ()

    def splits_phases(self) -> bool:
        """Whether this instance times layout apart from the payload (a family may differ per library API)."""
        return type(self).phases

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        """The routing/layout step alone (phases = True): what dispatch needs to move the payload."""
        raise NotImplementedError(f"{self.name} does not split layout from dispatch (phases = False)")

    @abc.abstractmethod
    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        """Without `layout`, compute it (a fresh dispatch). With one (from layout(), or an earlier
        Dispatched.handle of the same routing), move the payload only."""

    @abc.abstractmethod
    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        """expert_out [R, H] bf16, one row per received row, returns [T, H] bf16 summed at the source."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free buffers and communicators."""

    def library_versions(self) -> dict[str, str]:
        """Versions (and commits) of the libraries this backend measured, stored with the run."""
        return {}

    def host_sync_ops(self) -> dict[str, str]:
        """Op -> the host synchronisation that op contains (ops not named contain none); stored per op."""
        return {}

    def host_sync_note(self) -> str:
        """All of host_sync_ops in one line, for the case's record."""
        ops = self.host_sync_ops()
        return "; ".join(f"{op}: {what}" for op, what in ops.items()) or "none"

    def combine_dtype(self, case: CaseConfig) -> str:
        """Payload type of combine (bf16 unless the backend quantizes it)."""
        return "bf16"

    def bytes_per_token(self, case: CaseConfig, op: str) -> int:
        """Bytes of one row's payload in `op` ("dispatch" or "combine"), for byte accounting."""
        if op == "dispatch":
            return case.workload.bytes_per_token()
        return payload_bytes_per_token(case.workload.hidden, self.combine_dtype(case))

    def record(self, case: CaseConfig) -> dict[str, Any]:
        """Knobs and paths this backend actually used for `case` (stored with each number)."""
        return {}

    def case_record(self, case: CaseConfig) -> dict[str, Any]:
        """`record`, and what moelab model needs to bound the stored case (the dispatch family)."""
        family = {"dispatch_family": self.dispatch_family} if self.dispatch_family else {}
        return self.record(case) | family
