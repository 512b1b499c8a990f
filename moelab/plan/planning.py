"""From plain arguments to a checked RunSpec: every user error is found here, before anything launches.

`moelab run` only parses its flags into a RunRequest, probes the host (how many GPUs), calls plan_run and
prints; tests and other commands (verify, tune) build runs the same way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moelab.backends import registry
from moelab.backends.base import HostJob
from moelab.backends.capabilities import DefaultWorkload
from moelab.core.errors import MoelabError, SpecError
from moelab.core.models import ModelShape, model_shape
from moelab.core.spec import (
    MAX_REPEATS,
    CaseSpec,
    HealthSpec,
    LaunchSpec,
    RunSpec,
    TimingSpec,
    TraceSpec,
)
from moelab.core.validate import dedupe_backends, validate_label, validate_run_id
from moelab.job import launchers
from moelab.job.rundir import now_iso
from moelab.suites.loader import Suite, case_id_for, expand, load_suite

if TYPE_CHECKING:
    from moelab.backends.base import Registered

TRACE_MODES = ("none", "torch", "nsys")
TRACE_ITERS_DEFAULT = 5  # profiled iterations per op under --trace torch
WORKLOAD_FLAGS = ("hidden", "tokens_per_rank", "topk", "experts_per_rank", "routing", "seed", "dtype", "sms")
NEAREST_EXPERTS_PER_RANK = 8  # Hybrid-EP's tests' NUM_LOCAL_EXPERTS: the variant used when 2/rank cannot fit


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """What a user asked for, as plain values (None: the default)."""

    backends: Sequence[str] = (registry.DEFAULT_BACKEND,)
    suite: str | Suite = "dispatch-combine"  # a built-in's name, a file, or one built in code
    workload: Mapping[str, Sequence[Any]] = field(
        default_factory=dict
    )  # axis -> values, replaces the suite's
    cases: Sequence[str] = ()  # only these case ids
    model: str | None = None  # a layer shape of moelab.core.models; the workload flags above it win
    gpus: int | None = None
    gpus_per_node: int | None = None
    cpu: bool = False
    nodes: int = 1
    launcher: str = "local"  # resolved: not "auto"
    iters: int | None = None
    warmup: int | None = None
    noise_target: float | None = None
    max_iters: int | None = None
    repeat: int | None = None  # starts of each backend job (None: the suite's `repeat`, else 1)
    label: str | None = None
    run_id: str | None = None
    timeout_s: float = 900.0
    collective_timeout_s: float = 300.0
    rdzv_endpoint: str | None = None
    node_rank: int | None = None
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    backend_paths: Mapping[str, str] = field(default_factory=dict)
    trace: str = "none"
    trace_iters: int | None = None  # None: TRACE_ITERS_DEFAULT under --trace torch
    nsys_osrt: bool = False
    wrap: str | None = None
    bind: str | None = None
    emulate_internode: bool = False
    nccl_tests_bin: str | None = None
    kernel_cache: str = "auto"  # auto: the user's cache folder; off: compile in every job; else a folder
    require_healthy: bool = False
    health: bool = True
    command: Sequence[str] = ()


@dataclass(frozen=True, kw_only=True)
class HostFacts:
    """What the launching host has, probed by the caller."""

    cuda_devices: int = 0


@dataclass(frozen=True, kw_only=True)
class PlannedRun:
    spec: RunSpec
    notes: tuple[str, ...]  # said once at the start and stored with the run

    @property
    def runnable(self) -> list[CaseSpec]:
        return [c for c in self.spec.cases if not c.skip_reason]


# the largest value each count and time flag takes: each is planned, stored and waited for whole, so a value
# past these is a typo (a day of iterations, a week of timeout), refused at planning instead of after hours
FLAG_LIMITS: dict[str, float] = {
    "--gpus": 4096,
    "--gpus-per-node": 64,
    "--nodes": 4096,
    "--iters": 1_000_000,
    "--warmup": 1_000_000,
    "--max-iters": 1_000_000,
    "--trace-iters": 10_000,
    "--timeout": 7 * 24 * 3600,
    "--collective-timeout": 7 * 24 * 3600,
    "--library-timeout": 7 * 24 * 3600,
    "--repeat": MAX_REPEATS,
}


# the smallest each wall-clock flag takes: a job, a collective or a library test is not started, let alone
# finished, in less than a second, so `--timeout 1e-300` (every job killed as it starts) is a typo
FLAG_MINIMUMS: dict[str, float] = {"--timeout": 1.0, "--collective-timeout": 1.0, "--library-timeout": 1.0}


def check_positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    """A number flag: finite (NaN passes every `<=` test), above zero (or at it) and within FLAG_LIMITS."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{name} must be a finite number, got {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    least = FLAG_MINIMUMS.get(name)
    if least is not None and value < least:
        raise SpecError(f"{name} {value:g} is below the least this moelab waits, {least:g} s")
    limit = FLAG_LIMITS.get(name)
    if limit is not None and value > limit:
        raise SpecError(f"{name} {value} is above the largest this moelab plans, {limit:,.0f}")


KERNEL_CACHE_OFF = "off"


def resolve_kernel_cache(value: str) -> str | None:
    """The folder of moelab's kernel store (moelab.backends.jit_cache) for `--kernel-cache`: `auto` is
    the user's cache folder, `off` keeps none; a folder given must not be a file."""
    if value == KERNEL_CACHE_OFF:
        return None
    if value == "auto":
        import platformdirs

        return str(Path(platformdirs.user_cache_dir("moelab", appauthor=False)) / "kernels")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise SpecError(f"--kernel-cache {value}: not a folder")
    return str(path.resolve())


def check_request(req: RunRequest) -> None:
    """Flag values that are wrong whatever the suite."""
    if not req.backends:
        raise SpecError("--backend names no backend")
    dedupe_backends(req.backends)
    for name, value in (
        ("--gpus", req.gpus),
        ("--gpus-per-node", req.gpus_per_node),
        ("--nodes", req.nodes),
        ("--iters", req.iters),
        ("--timeout", req.timeout_s),
        ("--collective-timeout", req.collective_timeout_s),
        ("--trace-iters", req.trace_iters),
        ("--max-iters", req.max_iters),
        ("--repeat", req.repeat),
    ):
        check_positive(name, value)
    check_positive("--warmup", req.warmup, allow_zero=True)
    if req.noise_target is not None and not 0 < req.noise_target < 1:
        raise SpecError(f"--noise-target must be between 0 and 1 (a fraction), got {req.noise_target}")
    if req.launcher not in launchers.LAUNCHERS:
        raise SpecError(
            f"unknown launcher {req.launcher!r}: choose one of auto, {', '.join(launchers.LAUNCHERS)}"
        )
    if req.trace not in TRACE_MODES:
        raise SpecError(f"unknown --trace {req.trace!r}: choose none, torch or nsys")
    if req.bind not in (None, "numa"):
        raise SpecError(f"unknown --bind {req.bind!r}: the only binding is numa")
    check_flags_read(req)
    if req.nodes > 1 and req.launcher == "local":
        raise SpecError(
            f"--nodes {req.nodes} needs --launcher torchrun, slurm or mpirun (local runs one host)"
        )
    if req.node_rank is not None and req.node_rank < 0:
        raise SpecError(f"--node-rank must be >= 0, got {req.node_rank}")
    resolve_kernel_cache(req.kernel_cache)
    if req.run_id is not None:
        validate_run_id(req.run_id)
    if req.label is not None:
        validate_label(req.label)
    unknown = sorted(set(req.workload) - set(WORKLOAD_FLAGS))
    if unknown:
        raise SpecError(f"unknown workload axis {', '.join(unknown)}")
    known = registry.entries()
    for name in req.backends:
        if name not in known:
            raise SpecError(f"unknown backend {name!r}: known backends are {', '.join(known)}")


def check_flags_read(req: RunRequest) -> None:
    """Each flag that only another flag, or another launcher, reads: given without it, it would be
    ignored without a word (`--time` is --sbatch's, checked by the CLI where that flag lives)."""
    if req.require_healthy and not req.health:
        raise SpecError("--require-healthy judges the health snapshot that --no-health turns off: give one")
    if req.nsys_osrt and req.trace != "nsys":
        raise SpecError(f"--nsys-osrt needs --trace nsys (--trace is {req.trace})")
    if req.iters is not None and (
        stop := [
            f
            for f, v in (("--max-iters", req.max_iters), ("--noise-target", req.noise_target))
            if v is not None
        ]
    ):
        verb = "bounds" if len(stop) == 1 else "bound"
        raise SpecError(
            f"{' and '.join(stop)} {verb} the stop on a stable median, which --iters {req.iters} replaces "
            "with a fixed count: give one"
        )
    if req.trace_iters is not None and req.trace != "torch":
        raise SpecError(
            f"--trace-iters counts the iterations --trace torch profiles (--trace is {req.trace})"
        )
    if req.node_rank is not None and req.launcher != "torchrun":
        raise SpecError(f"--node-rank is torchrun's, across nodes (--launcher is {req.launcher})")
    if req.rdzv_endpoint is not None and req.launcher not in ("torchrun", "mpirun"):
        raise SpecError(f"--rdzv-endpoint is torchrun's or mpirun's (--launcher is {req.launcher})")
    given = [
        f
        for f, v in (("--container-image", req.container_image), ("--container-mounts", req.container_mounts))
        if v
    ]
    if given and req.launcher != "slurm":
        raise SpecError(
            f"{' and '.join(given)}: pyxis containers start under srun: give --launcher slurm or --sbatch "
            f"(--launcher is {req.launcher})"
        )
    if req.container_mounts and req.container_image is None:
        raise SpecError("--container-mounts mounts into the container of --container-image: give both")


def check_suite_backends(suite: Suite) -> None:
    """A [backend.NAME] section names a backend moelab knows (a typo there would silently do nothing)."""
    known = registry.entries()
    for name in sorted(set(suite.backend_axes) | set(suite.backend_workload)):
        if name not in known:
            raise SpecError(
                f"{suite.source}: [backend.{name}] names no known backend (known: {', '.join(known)})"
            )


def load_backends(names: Sequence[str]) -> dict[str, type[Registered]]:
    """Each backend of the run, loaded once: a load scans the entry points, too slow to do per case."""
    return {name: registry.load(name) for name in names}


def check_knobs(cases: Sequence[CaseSpec], classes: Mapping[str, type[Registered]]) -> None:
    """Every case's settings through their owners' checks (an e2e case's layer settings against its
    workload and SMs, the knobs the backend's): an unknown or misspelt knob, or a bad value, is refused here
    with the valid names, never stored as an unsupported case."""
    for case in cases:
        if case.e2e is not None:
            case.e2e.resolve(case.workload, case.sms)
        classes[case.backend].check_knobs(case.knobs, case.workload)


def host_job_cases(cases: Sequence[CaseSpec], classes: Mapping[str, type[Registered]]) -> list[CaseSpec]:
    """A backend the launching host runs as one job (nccl-tests) has cases of the host kind; it has no e2e
    layer to run."""
    out = []
    for case in cases:
        if not issubclass(classes[case.backend], HostJob):
            out.append(case)
        elif case.kind == "e2e":
            raise SpecError(f"{case.backend} runs as one job of the launching host: it has no e2e cases")
        else:
            out.append(replace(case, kind="host"))
    return out


def _world(req: RunRequest, host: HostFacts) -> tuple[str, int, int]:
    """(device, ranks per node, ranks per node for accounting)."""
    use_cuda = host.cuda_devices > 0 and not req.cpu
    nproc = req.gpus or (req.gpus_per_node if req.nodes > 1 and req.gpus_per_node else None)
    if nproc is None:
        nproc = host.cuda_devices if use_cuda else 2
    if use_cuda and req.launcher == "local" and nproc > host.cuda_devices:
        raise SpecError(f"--gpus {nproc} but this host has {host.cuda_devices} GPUs")
    return ("cuda" if use_cuda else "cpu"), nproc, req.gpus_per_node or nproc


def plan_world(req: RunRequest, host: HostFacts) -> tuple[str, int]:
    """(device, world size) of `req` on this host, its flags checked: for a command that needs the world size
    to choose a workload before it plans (tune's presets split a model's experts over the ranks)."""
    check_request(req)
    device, nproc, _ = _world(req, host)
    return device, nproc * req.nodes


def _model_request(req: RunRequest, world: int) -> tuple[RunRequest, ModelShape | None, list[str]]:
    """`req` with its model's hidden, topk and experts per rank (experts / ranks) as workload flags, where
    the user did not give those flags; the model; and the note that says what it set and from where."""
    if req.model is None:
        return req, None, []
    shape = model_shape(req.model)
    workload = {k: list(v) for k, v in req.workload.items()}
    workload.setdefault("hidden", [shape.hidden])
    workload.setdefault("topk", [shape.topk])
    if "experts_per_rank" not in workload:
        workload["experts_per_rank"] = [shape.experts_per_rank(world)]
    return dataclasses.replace(req, workload=workload), shape, [f"note: {shape.describe(world)}"]


def _with_intermediate(cases: list[CaseSpec], intermediate: int) -> list[CaseSpec]:
    """The model's expert width for every e2e case (its `intermediate`); other cases have no experts."""
    out: list[CaseSpec] = []
    seen: set[tuple[str, str]] = set()
    for case in cases:
        if case.e2e is not None:
            e2e = dataclasses.replace(case.e2e, intermediate=intermediate)
            case = dataclasses.replace(case, e2e=e2e)
            case = dataclasses.replace(case, case_id=case_id_for(case.workload, case.sms, case.asked_knobs()))
        if (case.backend, case.case_id) not in seen:
            seen.add((case.backend, case.case_id))
            out.append(case)
    return out


def _fit_experts(req: RunRequest, suite: Suite, world: int) -> tuple[dict[str, list[Any]], list[str]]:
    """The reference workload needs topk <= experts/rank x ranks. When the user did not set experts per rank
    and the suite's value cannot fit this world size, use the documented nearest variant (8 per rank, as
    Hybrid-EP's tests do), and say so. A user's explicit flags are never overridden."""
    overrides = {k: list(v) for k, v in req.workload.items()}
    if "experts_per_rank" in overrides or "experts_per_rank" in suite.axes:
        return overrides, []
    epr = suite.workload.get("experts_per_rank")
    topks = overrides.get("topk") or suite.axes.get("topk") or [suite.workload.get("topk", 8)]
    if not isinstance(epr, int) or not all(isinstance(k, int) for k in topks):
        return overrides, []
    need = max(int(k) for k in topks)
    if epr * world >= need:
        return overrides, []
    fitted = max(NEAREST_EXPERTS_PER_RANK, -(-need // world))
    overrides["experts_per_rank"] = [fitted]
    note = (
        f"note: {epr} experts/rank x {world} ranks < topk {need}: using the nearest variant, {fitted} experts/rank "
        f"(as Hybrid-EP's tests do); set --experts-per-rank to choose"
    )
    return overrides, [note]


def timing_for(req: RunRequest, device: str) -> TimingSpec:
    base = TimingSpec.for_device(device)
    try:
        return TimingSpec(
            warmup=req.warmup if req.warmup is not None else base.warmup,
            iters=req.iters,
            min_iters=min(base.min_iters, req.max_iters) if req.max_iters else base.min_iters,
            max_iters=req.max_iters or base.max_iters,
            noise_target=req.noise_target or base.noise_target,
            min_time_s=base.min_time_s,
            batch=base.batch,
            pair_reps=base.pair_reps,
            pair_iters=base.pair_iters,
            chain=base.chain,
            flush_l2=base.flush_l2,
        )
    except ValueError as exc:
        raise SpecError(str(exc)) from exc


def _backend_defaults(classes: Mapping[str, type[Registered]]) -> dict[str, dict[str, Any]]:
    """Per-backend workload defaults (e.g. the low-latency kernels' own sizes), below the suite's values."""
    out: dict[str, dict[str, Any]] = {}
    for name, cls in classes.items():
        if isinstance(cls, DefaultWorkload) and cls.default_workload:
            out[name] = dict(cls.default_workload)
    return out


def plan_run(req: RunRequest, host: HostFacts, *, new_run_id: str) -> PlannedRun:
    """The checked RunSpec for `req` on this host; raises SpecError (one line) for any user error."""
    check_request(req)
    device, nproc, per_node = _world(req, host)
    world = nproc * req.nodes
    suite = req.suite if isinstance(req.suite, Suite) else load_suite(req.suite)
    check_suite_backends(suite)
    req, shape, model_notes = _model_request(req, world)
    overrides, notes = _fit_experts(req, suite, world)
    notes = model_notes + notes
    classes = load_backends(req.backends)
    try:
        cases = expand(suite, list(req.backends), world, overrides, _backend_defaults(classes))
    except MoelabError:
        raise
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{suite.source}: {exc}") from exc
    if shape is not None:
        cases = _with_intermediate(cases, shape.intermediate)
    if req.cases:
        ids = {c.case_id for c in cases}
        unknown = sorted(set(req.cases) - ids)
        if unknown:
            raise SpecError(f"no case {unknown[0]!r} in this run; list them with `moelab run --list-cases`")
        cases = [c for c in cases if c.case_id in req.cases]
    cases = host_job_cases(cases, classes)
    check_knobs([c for c in cases if not c.skip_reason], classes)
    if not any(not c.skip_reason for c in cases):
        raise SpecError(cases[0].skip_reason if cases else f"suite {suite.name} has no cases")
    spec = RunSpec(
        run_id=req.run_id or new_run_id,
        created_at=now_iso(),
        suite=suite.name,
        backends=tuple(req.backends),
        cases=tuple(cases),
        timing=timing_for(req, device),
        launch=LaunchSpec(
            device=device,
            nproc_per_node=nproc,
            nodes=req.nodes,
            gpus_per_node=per_node,
            launcher=req.launcher,
            job_timeout_s=req.timeout_s,
            collective_timeout_s=req.collective_timeout_s,
            rdzv_endpoint=req.rdzv_endpoint,
            node_rank=req.node_rank,
            container_image=req.container_image,
            container_mounts=tuple(req.container_mounts),
            backend_paths=dict(req.backend_paths),
            bind=req.bind,
            emulate_internode=req.emulate_internode,
            nccl_tests_bin=req.nccl_tests_bin,
            kernel_cache=resolve_kernel_cache(req.kernel_cache),
            repeats=req.repeat or suite.repeat,
        ),
        label=validate_label(req.label)
        if req.label is not None
        else None,  # stored in NFC, as it is looked up
        command=tuple(req.command),
        trace=TraceSpec(
            mode=req.trace,
            iters=TRACE_ITERS_DEFAULT if req.trace_iters is None else req.trace_iters,
            nsys_osrt=req.nsys_osrt,
            wrap=req.wrap,
        ),
        health=HealthSpec(snapshots=req.health, require_healthy=req.require_healthy),
        notes=tuple(notes),
    )
    return PlannedRun(spec=spec, notes=tuple(notes))
