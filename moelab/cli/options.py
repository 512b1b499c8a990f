"""The flags `moelab run`, `verify` and `tune` share, each declared once (name, type, default, help, help
panel), in groups that turn their values into the fields of a RunRequest (as asv's common_args does).

A command lists the flags it offers, in the order its help shows them, with `Flag.but(...)` where it
means something else by one (verify's --hidden is one number); `command(...)` builds the typer signature
from that list and calls the command with one instance per option group it takes (a flag the command
does not offer keeps its group's default, which is the RunRequest default) and its own flags by name.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import typer

from moelab.backends import nccl_tests
from moelab.cli.common import DB_OPTION_HELP, parse_list
from moelab.core.errors import SpecError
from moelab.core.workload import ROUTING_KINDS

BACKENDS_PANEL, WORKLOAD_PANEL, LAUNCH_PANEL = "Backends and knobs", "Workload", "Launch"
TIMING_PANEL, STORE_PANEL, TRACING_PANEL, HEALTH_PANEL = "Timing", "Store", "Tracing", "Health"


class Options:
    """Base of an option group: a frozen dataclass whose fields are flag values, each defaulting to what a
    command that does not offer the flag gets."""


@dataclass(frozen=True)
class Flag:
    """One flag: the parameter it fills, its type, default, option names, help and help panel."""

    name: str
    annotation: Any
    default: Any = None
    decls: tuple[str, ...] = ()
    help: str = ""
    panel: str | None = None
    group: type[Options] | None = None  # the option group whose field it fills (None: the command's own)
    metavar: str | None = None  # what the flag takes, shown in --help (a bool flag takes nothing)

    def but(self, **changes: Any) -> Flag:
        """This flag as one command means it (another help, default or type)."""
        return dataclasses.replace(self, **changes)

    def parameter(self, panels: bool) -> inspect.Parameter:
        option = typer.Option(
            self.default,
            *self.decls,
            help=self.help,
            rich_help_panel=self.panel if panels else None,
            metavar="" if self.annotation is bool else self.metavar,
        )
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=self.annotation
        )


def parse_backend_paths(values: list[str]) -> dict[str, str]:
    """--backend-path NAME=DIR (repeatable) -> {NAME: absolute DIR}; DIR must be a folder."""
    out = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise SpecError(f"--backend-path takes NAME=DIR, got {v!r}")
        if not Path(path).is_dir():
            raise SpecError(f"--backend-path {name}: {path} is not a directory")
        out[name] = str(Path(path).resolve())
    return out


@dataclass(frozen=True, kw_only=True)
class BackendOptions(Options):
    backend: str | None = None
    backend_path: list[str] = field(default_factory=list)
    nccl_tests_bin: str | None = None
    kernel_cache: str = "auto"

    def names(self) -> tuple[str, ...]:
        return tuple(parse_list(self.backend, str, "backend") or [])

    def paths(self) -> dict[str, str]:
        return parse_backend_paths(self.backend_path)


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions(Options):
    """As the command declares them: run takes comma-separated lists, verify one number, tune integers."""

    hidden: Any = None
    tokens_per_rank: Any = None
    topk: Any = None
    experts_per_rank: Any = None
    routing: Any = None
    seed: Any = None
    dtype: Any = None
    sms: Any = None
    KINDS: ClassVar[dict[str, type]] = {
        "hidden": int,
        "tokens_per_rank": int,
        "topk": int,
        "experts_per_rank": int,
        "routing": str,
        "seed": int,
        "dtype": str,
        "sms": int,
    }

    def axes(self) -> dict[str, list[Any]]:
        """The comma-separated lists given, per workload axis (they replace the suite's)."""
        out = {}
        for key, kind in self.KINDS.items():
            parsed = parse_list(getattr(self, key), kind, key.replace("_", "-"))
            if parsed is not None:
                out[key] = parsed
        return out


@dataclass(frozen=True, kw_only=True)
class LaunchOptions(Options):
    gpus: int | None = None
    gpus_per_node: int | None = None
    cpu: bool = False
    nodes: int = 1
    launcher: str = "local"  # "auto": SLURM inside an allocation, else local
    rdzv_endpoint: str | None = None
    node_rank: int | None = None
    timeout: float = 900.0
    collective_timeout: float = 300.0
    bind: str | None = None
    emulate_internode: bool = False

    def request_fields(self) -> dict[str, Any]:
        from moelab.job import launchers

        launcher = launchers.auto_launcher(os.environ) if self.launcher == "auto" else self.launcher
        return dict(
            gpus=self.gpus,
            gpus_per_node=self.gpus_per_node,
            cpu=self.cpu,
            nodes=self.nodes,
            launcher=launcher,
            rdzv_endpoint=self.rdzv_endpoint,
            node_rank=self.node_rank,
            timeout_s=self.timeout,
            collective_timeout_s=self.collective_timeout,
            bind=self.bind,
            emulate_internode=self.emulate_internode,
        )


@dataclass(frozen=True, kw_only=True)
class TimingOptions(Options):
    iters: int | None = None
    warmup: int | None = None
    noise_target: float | None = None
    max_iters: int | None = None
    repeat: int | None = None

    def request_fields(self) -> dict[str, Any]:
        return dict(
            iters=self.iters,
            warmup=self.warmup,
            noise_target=self.noise_target,
            max_iters=self.max_iters,
            repeat=self.repeat,
        )


@dataclass(frozen=True, kw_only=True)
class StoreOptions(Options):
    label: str | None = None
    db: str | None = None
    out: Path | None = None
    report: Path | None = None
    run_id: str | None = None

    def request_fields(self) -> dict[str, Any]:
        return dict(label=self.label, run_id=self.run_id)

    def runs_root(self) -> Path:
        from moelab.store.db import data_dir

        return self.out or (data_dir() / "runs")


@dataclass(frozen=True, kw_only=True)
class TraceOptions(Options):
    trace: str = "none"
    trace_iters: int = 5
    nsys_osrt: bool = False
    wrap: str | None = None

    def request_fields(self) -> dict[str, Any]:
        return dict(trace=self.trace, trace_iters=self.trace_iters, nsys_osrt=self.nsys_osrt, wrap=self.wrap)


@dataclass(frozen=True, kw_only=True)
class HealthOptions(Options):
    require_healthy: bool = False
    health: bool = True

    def request_fields(self) -> dict[str, Any]:
        return dict(require_healthy=self.require_healthy, health=self.health)


@dataclass(frozen=True, kw_only=True)
class SbatchOptions(Options):
    sbatch: bool = False
    partition: str | None = None
    account: str | None = None
    time_limit: str = "00:30:00"
    container_image: str | None = None
    container_mounts: str | None = None


def _flags(
    group: type[Options], panel: str, *specs: tuple[str, Any, Any, tuple[str, ...], str, str | None]
) -> list[Flag]:
    """Flags of one option group: (name, type, default, option names, help, metavar) each."""
    return [
        Flag(name, kind, default, decls, text, panel, group, metavar)
        for name, kind, default, decls, text, metavar in specs
    ]


BACKEND_FLAGS = _flags(
    BackendOptions,
    BACKENDS_PANEL,
    (
        "backend",
        str | None,
        None,
        ("--backend", "-b"),
        "Backend(s), comma-separated; see `moelab backends`",
        "NAME[,NAME…]",
    ),
    (
        "backend_path",
        list[str],
        [],
        ("--backend-path",),
        "NAME=DIR: put DIR first on PYTHONPATH for backend NAME's job (e.g. its deep_ep build)",
        "NAME=DIR",
    ),
    (
        "nccl_tests_bin",
        str | None,
        None,
        ("--nccl-tests-bin",),
        f"alltoall_perf (or its folder) for --backend {nccl_tests.BACKEND}; default: PATH",
        "PATH",
    ),
    (
        "kernel_cache",
        str,
        "auto",
        ("--kernel-cache",),
        "Folder where backends that compile kernels on first use (Hybrid-EP) keep them across jobs; "
        "auto: the user's cache folder; off: compile in every job",
        "DIR|auto|off",
    ),
)
WORKLOAD_FLAGS = _flags(
    WorkloadOptions,
    WORKLOAD_PANEL,
    ("hidden", str | None, None, (), "Hidden size(s), comma-separated; replaces the suite's", "N[,N…]"),
    (
        "tokens_per_rank",
        str | None,
        None,
        ("--tokens-per-rank",),
        "Tokens per rank, comma-separated",
        "N[,N…]",
    ),
    ("topk", str | None, None, (), "Experts per token, comma-separated", "N[,N…]"),
    (
        "experts_per_rank",
        str | None,
        None,
        ("--experts-per-rank",),
        "Experts per rank, comma-separated",
        "N[,N…]",
    ),
    ("routing", str | None, None, (), f"Routing kind(s): {', '.join(ROUTING_KINDS)}", "KIND[,KIND…]"),
    ("seed", str | None, None, (), "Routing seed(s)", "N[,N…]"),
    ("dtype", str | None, None, (), "Dispatch payload(s): bf16, fp8, mxfp8", "TYPE[,TYPE…]"),
)
(SMS,) = _flags(
    WorkloadOptions,
    BACKENDS_PANEL,
    (
        "sms",
        str | None,
        None,
        (),
        "SM counts, comma-separated ('default' = the library's own choice)",
        "N|default[,…]",
    ),
)
RANK_FLAGS = _flags(
    LaunchOptions,
    LAUNCH_PANEL,
    (
        "gpus",
        int | None,
        None,
        ("--gpus",),
        "Ranks on this host (default: every local GPU, else 2 CPU ranks)",
        "N",
    ),
    (
        "gpus_per_node",
        int | None,
        None,
        ("--gpus-per-node",),
        "Ranks per node for byte accounting (default: ranks on this host)",
        "N",
    ),
    ("cpu", bool, False, ("--cpu",), "Run on CPU ranks (gloo) even when GPUs are present", None),
    (
        "timeout",
        float,
        900.0,
        (),
        "Wall-clock limit of one backend job, seconds; then it is killed and recorded as failed",
        "SECONDS",
    ),
    (
        "collective_timeout",
        float,
        300.0,
        ("--collective-timeout",),
        "torch.distributed timeout of a hung collective, seconds",
        "SECONDS",
    ),
    (
        "launcher",
        str,
        "auto",
        ("--launcher",),
        "auto (SLURM inside an allocation, else local), local, torchrun, slurm or mpirun",
        "auto|local|torchrun|slurm|mpirun",
    ),
    (
        "nodes",
        int,
        1,
        ("--nodes",),
        "Nodes; with --gpus-per-node, the world size is nodes x gpus-per-node",
        "N",
    ),
    (
        "rdzv_endpoint",
        str | None,
        None,
        ("--rdzv-endpoint",),
        "torchrun multi-node: HOST:PORT of the c10d rendezvous (node 0's)",
        "HOST:PORT",
    ),
    (
        "node_rank",
        int | None,
        None,
        ("--node-rank",),
        "torchrun multi-node: this node's rank; node 0 hosts the rendezvous and stores the run",
        "N",
    ),
)
PLACEMENT_FLAGS = _flags(
    LaunchOptions,
    LAUNCH_PANEL,
    (
        "bind",
        str | None,
        None,
        ("--bind",),
        "numa: pin each rank to the CPUs and memory of its GPU's NUMA node",
        "numa",
    ),
    (
        "emulate_internode",
        bool,
        False,
        ("--emulate-internode",),
        "Force NCCL's network (socket) transport between every pair of ranks, as between nodes",
        None,
    ),
)
SBATCH_FLAGS = _flags(
    SbatchOptions,
    LAUNCH_PANEL,
    (
        "sbatch",
        bool,
        False,
        ("--sbatch",),
        "Outside a SLURM allocation: write a batch script that runs this command and submit it",
        None,
    ),
    ("partition", str | None, None, (), "--sbatch: SLURM partition", "NAME"),
    ("account", str | None, None, (), "--sbatch: SLURM account", "NAME"),
    ("time_limit", str, "00:30:00", ("--time",), "--sbatch: SLURM time limit", "HH:MM:SS"),
    (
        "container_image",
        str | None,
        None,
        ("--container-image",),
        "srun/sbatch with pyxis: container image",
        "IMAGE",
    ),
    (
        "container_mounts",
        str | None,
        None,
        ("--container-mounts",),
        "srun/sbatch with pyxis: SRC:DST[,...]",
        "SRC:DST[,…]",
    ),
)
TIMING_FLAGS = _flags(
    TimingOptions,
    TIMING_PANEL,
    (
        "iters",
        int | None,
        None,
        (),
        "A fixed count of timed iterations per op (default: stop once the median is stable, see --noise-target)",
        "N",
    ),
    ("warmup", int | None, None, (), "Warm-up iterations per op", "N"),
    (
        "noise_target",
        float | None,
        None,
        ("--noise-target",),
        "Stop timing an op once its median is known within this fraction (default 0.02 on GPU)",
        "FRACTION",
    ),
    (
        "max_iters",
        int | None,
        None,
        ("--max-iters",),
        "Most timed iterations per op when stopping on noise",
        "N",
    ),
    (
        "repeat",
        int | None,
        None,
        ("--repeat",),
        "Start each backend job N times, in rotated order; each start is a process sample (intervals, "
        "compare and check use the variation between them). Default: the suite's `repeat`, else 1",
        "N",
    ),
)
STORE_FLAGS = _flags(
    StoreOptions,
    STORE_PANEL,
    ("label", str | None, None, (), "A name for this run (baselines, comparisons)", "NAME"),
    ("db", str | None, None, ("--db",), DB_OPTION_HELP, "FILE"),
    (
        "out",
        Path | None,
        None,
        ("--out",),
        "Folder for run directories (default: runs/ in the user's data directory)",
        "DIR",
    ),
    (
        "report",
        Path | None,
        None,
        ("--report",),
        "Also write the HTML report of this run to this file",
        "FILE",
    ),
    (
        "run_id",
        str | None,
        None,
        ("--run-id",),
        "Run id (multi-node torchrun: give every node the same one)",
        "ID",
    ),
)
TRACE_FLAGS = _flags(
    TraceOptions,
    TRACING_PANEL,
    (
        "trace",
        str,
        "none",
        ("--trace",),
        "none, torch (torch.profiler Chrome traces + kernel-only times) or nsys (each rank under nsys profile)",
        "none|torch|nsys",
    ),
    ("trace_iters", int, 5, ("--trace-iters",), "Profiled iterations per op with --trace torch", "N"),
    ("nsys_osrt", bool, False, ("--nsys-osrt",), "--trace nsys: also trace OS runtime calls", None),
    (
        "wrap",
        str | None,
        None,
        ("--wrap",),
        "Run each rank under a tool, e.g. 'ncu --profile-from-start off -o {out}'; {out} and {rank} are expanded",
        "COMMAND",
    ),
)
HEALTH_FLAGS = _flags(
    HealthOptions,
    HEALTH_PANEL,
    (
        "require_healthy",
        bool,
        False,
        ("--require-healthy",),
        "Refuse to start a backend job on a node whose health check fails",
        None,
    ),
    (
        "health",
        bool,
        True,
        ("--health/--no-health",),
        "Health snapshot (NVML, sysfs) before and after each backend job",
        None,
    ),
)
BACKEND, BACKEND_PATH, NCCL_TESTS_BIN, KERNEL_CACHE = BACKEND_FLAGS
HIDDEN, TOKENS_PER_RANK, TOPK, EXPERTS_PER_RANK, ROUTING, SEED, DTYPE = WORKLOAD_FLAGS
GPUS, GPUS_PER_NODE, CPU, TIMEOUT, COLLECTIVE_TIMEOUT, LAUNCHER, NODES, RDZV_ENDPOINT, NODE_RANK = RANK_FLAGS
BIND, EMULATE_INTERNODE = PLACEMENT_FLAGS
SBATCH, PARTITION, ACCOUNT, TIME_LIMIT, CONTAINER_IMAGE, CONTAINER_MOUNTS = SBATCH_FLAGS
ITERS, WARMUP, NOISE_TARGET, MAX_ITERS, REPEAT = TIMING_FLAGS
LABEL, DB, OUT, REPORT, RUN_ID = STORE_FLAGS
TRACE, TRACE_ITERS, NSYS_OSRT, WRAP = TRACE_FLAGS
REQUIRE_HEALTHY, HEALTH = HEALTH_FLAGS
DRY_RUN = Flag(
    "dry_run",
    bool,
    False,
    ("--dry-run",),
    "Print the exact launch command(s) (or batch script with --sbatch) and exit",
    LAUNCH_PANEL,
)


def command(*flags: Flag, panels: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The typer signature of a command from `flags`, in the order its help lists them (`panels`: keep their
    help panels). The command takes one parameter per option group it uses, annotated with the group's
    class, and one per flag of its own, by the flag's name."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(fn)
        groups = {p: t for p, t in hints.items() if isinstance(t, type) and issubclass(t, Options)}
        own = {f.name for f in flags if f.group not in groups.values()}
        missing = set(inspect.signature(fn).parameters) - set(groups) - own
        if missing or own - set(inspect.signature(fn).parameters):
            raise TypeError(
                f"{fn.__name__}: parameters {sorted(missing)} and flags {sorted(own)} do not match"
            )

        @functools.wraps(fn)
        def call(**values: Any) -> Any:
            kwargs = {
                p: t(**{f.name: values[f.name] for f in flags if f.group is t}) for p, t in groups.items()
            }
            return fn(**kwargs, **{name: values[name] for name in own})

        call.__signature__ = inspect.Signature([f.parameter(panels) for f in flags])  # type: ignore[attr-defined]
        call.__annotations__ = {f.name: f.annotation for f in flags}
        return call

    return decorate
