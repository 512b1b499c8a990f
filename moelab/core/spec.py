"""The run spec: everything a run needs, built once by the CLI, written to the run directory as
spec.json, and read back by every rank. Nothing else configures a worker."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab.core.e2e_spec import BENCH_A2A, BENCH_E2E, BENCH_KNOB, BENCHES, E2E_KEYS, E2ESpec, a2a_knobs
from moelab.core.errors import SpecError
from moelab.core.workload import Workload

SPEC_VERSION = 1


# starts of each backend job: the job order is planned, written and stored whole, and each start is a whole
# process launch (seconds); a thousand starts of a job is days of a machine, more is a typo
MAX_REPEATS = 1000


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingSpec:
    """How long to time: warm-up, then batches until the median's noise is under `noise_target` (after
    `min_iters` and `min_time_s`, at most `max_iters`), or exactly `iters` when that is set."""

    warmup: int = 10
    iters: int | None = None  # a fixed count (--iters); None: stop on noise
    min_iters: int = 20
    max_iters: int = 300
    noise_target: float = 0.02  # relative half-width of the median's ~95% confidence interval
    min_time_s: float = 0.0
    batch: int = 10  # iterations between two looks at the noise
    pair_reps: int = 5  # e2e layer: samples of `pair_iters` back-to-back layers each
    pair_iters: int = 10
    chain: int = (
        10  # the pair op: dispatch→combine pairs chained per timed iteration (the period is time / K)
    )
    flush_l2: bool = True  # GPU only: overwrite a buffer larger than L2 before each timed iteration
    peaks: bool = (
        True  # measure this machine's link figures once per run (moelab.measure.peaks; CPU: gloo, small)
    )

    def __post_init__(self) -> None:
        if self.iters is not None and self.iters < 1:
            raise ValueError(f"iters must be at least 1, got {self.iters}")
        if self.warmup < 0 or self.min_iters < 1 or self.max_iters < self.min_iters or self.batch < 1:
            raise ValueError("timing: need warmup >= 0, 1 <= min_iters <= max_iters and batch >= 1")
        if self.chain < 1:
            raise ValueError(f"chain must be at least 1, got {self.chain}")
        if not 0 < self.noise_target < 1:
            raise ValueError(f"noise target must be in (0, 1), got {self.noise_target}")

    @property
    def bounds(self) -> tuple[int, int]:
        """(least, most) iterations per op."""
        return (self.iters, self.iters) if self.iters is not None else (self.min_iters, self.max_iters)

    @classmethod
    def for_device(cls, device: str) -> TimingSpec:
        """GPU: stop on 2% noise between 20 and 300 iterations. CPU (gloo): fewer, since one reference
        iteration takes ~0.1 s there."""
        if device == "cuda":
            return cls()
        return cls(
            warmup=2,
            min_iters=6,
            max_iters=20,
            batch=6,
            noise_target=0.05,
            pair_reps=3,
            pair_iters=2,
            chain=3,
            flush_l2=False,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSpec:
    device: str = "cpu"  # "cuda" or "cpu"
    nproc_per_node: int = 2
    nodes: int = 1
    gpus_per_node: int = 2  # defines node membership for byte accounting
    launcher: str = "local"  # local | torchrun | slurm | mpirun
    job_timeout_s: float = 900.0  # wall clock for one backend job; then its whole process group is killed
    collective_timeout_s: float = 300.0  # torch.distributed timeout for a hung collective
    rdzv_endpoint: str | None = None  # torchrun multi-node: HOST:PORT of the c10d store
    node_rank: int | None = None  # torchrun multi-node: 0 hosts the rendezvous and stores the run
    backend_paths: dict[str, str] = field(
        default_factory=dict
    )  # backend -> extra PYTHONPATH (its deep_ep build)
    bind: str | None = None  # "numa": pin each rank to its GPU's NUMA node
    emulate_internode: bool = False  # NCCL's network transport between every pair (see runner.job_env)
    nccl_tests_bin: str | None = None  # alltoall_perf, or the folder holding it (--backend nccl-tests)
    kernel_cache: str | None = None  # folder where JIT-compiling backends keep kernels across jobs; None: off
    # --launcher slurm with pyxis: the image every rank's srun starts in, and SRC:DST mounts into it
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    # starts of each backend job, in rotated order (A B C, B C A, ...): each start is a process sample of its
    # own, so a comparison can see the variation between processes, not only between iterations
    repeats: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "container_mounts", tuple(self.container_mounts))  # a JSON list, read back
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(f"repeats must be from 1 to {MAX_REPEATS:,}, got {self.repeats}")

    @property
    def world(self) -> int:
        return self.nodes * self.nproc_per_node


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceSpec:
    mode: str = "none"  # none | torch | nsys
    iters: int = 5  # profiled iterations per op (torch)
    nsys_osrt: bool = False
    wrap: str | None = None  # an external tool around each rank, e.g. "ncu --profile-from-start off -o {out}"


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthSpec:
    snapshots: bool = True  # a health snapshot before and after each backend job
    require_healthy: bool = False  # refuse to start on a failing node
    load_ms: float = 300.0  # clocks under a short matmul load in each snapshot (GPU only)


CASE_KINDS = ("a2a", "e2e", "host")


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseSpec:
    """One case: what it measures (`kind`: a dispatch/combine case, an e2e layer, or a case of a host job
    such as nccl-tests), on which backend, workload and SMs, with the backend's knobs and, for an e2e case,
    the layer's settings."""

    case_id: str
    backend: str
    workload: Workload
    sms: int | None = None
    kind: str = "a2a"
    knobs: dict[str, Any] = field(default_factory=dict)  # the backend's own knobs
    e2e: E2ESpec | None = None  # kind e2e: the layer's settings as asked
    skip_reason: str | None = None  # an invalid combination, stored as skipped

    def __post_init__(self) -> None:
        if self.kind not in CASE_KINDS:
            raise SpecError(f"case kind {self.kind!r} is not one of {', '.join(CASE_KINDS)}")
        if (self.kind == "e2e") != (self.e2e is not None):
            raise SpecError(f"case {self.case_id}: an e2e case carries e2e settings, and only an e2e case")

    @classmethod
    def from_asked(cls, *, knobs: Mapping[str, Any], kind: str | None = None, **fields: Any) -> CaseSpec:
        """A case from its knobs as a suite writes them: `bench = "e2e"` and the e2e knobs make an e2e case,
        the rest are the backend's."""
        bench = knobs.get(BENCH_KNOB)
        if bench is not None and bench not in BENCHES:
            raise SpecError(
                f"unknown bench {bench!r}: {BENCH_A2A} (dispatch/combine) or {BENCH_E2E} (the MoE layer)"
            )
        rest = a2a_knobs(knobs)  # bench = "a2a": the layer's knobs belong to the e2e cases of the same axes
        rest.pop(BENCH_KNOB, None)
        if bench is None or bench == BENCH_A2A:
            return cls(kind=kind or "a2a", knobs=rest, **fields)
        e2e = E2ESpec.from_knobs(rest)
        backend_knobs = {k: v for k, v in rest.items() if k not in E2E_KEYS}
        return cls(kind=kind or "e2e", knobs=backend_knobs, e2e=e2e, **fields)

    def asked_knobs(self) -> dict[str, Any]:
        """The knobs as a suite writes them (the store's `knobs` column and spec.json keep this form)."""
        if self.e2e is None:
            return dict(self.knobs)
        return {BENCH_KNOB: BENCH_E2E, **self.e2e.to_knobs(), **self.knobs}

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "backend": self.backend,
            "kind": self.kind,
            "workload": self.workload.to_dict(),
            "sms": self.sms,
            "knobs": self.asked_knobs(),
            "skip_reason": self.skip_reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseSpec:
        return cls.from_asked(
            knobs=dict(d.get("knobs") or {}),
            kind=d.get("kind"),
            case_id=d["case_id"],
            backend=d["backend"],
            workload=Workload.from_dict(d["workload"]),
            sms=d.get("sms"),
            skip_reason=d.get("skip_reason"),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    run_id: str
    created_at: str
    suite: str
    backends: tuple[str, ...]
    cases: tuple[CaseSpec, ...]
    timing: TimingSpec
    launch: LaunchSpec
    label: str | None = None
    command: tuple[str, ...] = ()
    trace: TraceSpec = field(default_factory=TraceSpec)
    health: HealthSpec = field(default_factory=HealthSpec)
    notes: tuple[str, ...] = ()  # what the planner chose for the user (e.g. the nearest workload variant)
    spec_version: int = SPEC_VERSION

    def cases_for(self, backend: str) -> list[CaseSpec]:
        return [c for c in self.cases if c.backend == backend]

    def job_order(self) -> list[tuple[str, int]]:
        """(backend, repeat) in the order the jobs start: every backend once per repeat, the order rotated
        by one each time (A B C, then B C A, then C A B), so no backend always runs first or after another."""
        names = list(self.backends)
        return [
            (names[(k + i) % len(names)], k) for k in range(self.launch.repeats) for i in range(len(names))
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec_version": self.spec_version,
            "run_id": self.run_id,
            "created_at": self.created_at,
            "suite": self.suite,
            "backends": list(self.backends),
            "cases": [c.to_dict() for c in self.cases],
            "timing": dataclasses.asdict(self.timing),
            "launch": dataclasses.asdict(self.launch),
            "label": self.label,
            "command": list(self.command),
            "trace": dataclasses.asdict(self.trace),
            "health": dataclasses.asdict(self.health),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        if d.get("spec_version") != SPEC_VERSION:
            raise ValueError(f"spec version {d.get('spec_version')} is not {SPEC_VERSION}")
        return cls(
            run_id=d["run_id"],
            created_at=d["created_at"],
            suite=d["suite"],
            backends=tuple(d["backends"]),
            cases=tuple(CaseSpec.from_dict(c) for c in d["cases"]),
            timing=TimingSpec(**d["timing"]),
            launch=LaunchSpec(**d["launch"]),
            label=d.get("label"),
            command=tuple(d.get("command") or ()),
            trace=TraceSpec(**d.get("trace", {})),
            health=HealthSpec(**d.get("health", {})),
            notes=tuple(d.get("notes") or ()),
        )

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        return cls.from_dict(json.loads(path.read_text()))
