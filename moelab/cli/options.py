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
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import typer

from moelab.backends import nccl_tests
from moelab.cli.common import DB_OPTION_HELP, parse_list
from moelab.core.errors import SpecError
from moelab.core.workload import ROUTING_KINDS

BACKENDS_PANEL, WORKLOAD_PANEL, LAUNCH_PANEL = "Backends and knobs", "Workload", "Launch"
TIMING_PANEL, STORE_PANEL, TRACING_PANEL, HEALTH_PANEL = "Timing", "Store", "Tracing", "Health"


_FLAG = "moelab_flag"
_AS_FIELD: Any = object()  # a flag shows its field's default


@dataclass(frozen=True, kw_only=True)
class FlagText:
    """What a flag's one declaration says beyond its field's name, type and default."""

    help: str
    decls: tuple[str, ...] = ()  # option names (none: typer's from the field name)
    metavar: str | None = None  # what the flag takes, shown in --help (a bool flag takes nothing)
    panel: str | None = None  # its help panel, where not its group's
    annotation: Any = None  # the flag's type, where the field holds values of several (workload axes)
    shown_default: Any = _AS_FIELD  # the default a command offering the flag shows, where not the field's
    request: str | None = ""  # the RunRequest field it fills ("": its own name; None: none)


def flag(default: Any, help: str, *decls: str, metavar: str | None = None, **text: Any) -> Any:
    """A field of an option group that is a flag: its default (what a command that does not offer the flag
    gets), help and option names, declared once; typer's parameter and the request field derive from it."""
    meta = {_FLAG: FlagText(help=help, decls=decls, metavar=metavar, **text)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


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


class Options:
    """Base of an option group: a frozen dataclass whose fields, declared with `flag`, are flag values, each
    defaulting to what a command that does not offer the flag gets (the RunRequest default)."""

    PANEL: ClassVar[str]

    @classmethod
    def flags(cls, *names: str) -> tuple[Flag, ...]:
        """The group's flags named (all of them, in declaration order, without names)."""
        every = _group_flags(cls)
        unknown = [n for n in names if n not in every]
        if unknown:
            raise TypeError(f"{cls.__name__} has no flag(s) {', '.join(unknown)}")
        return tuple(every[n] for n in names) if names else tuple(every.values())

    @classmethod
    def flag(cls, name: str) -> Flag:
        (one,) = cls.flags(name)
        return one

    def request_fields(self) -> dict[str, Any]:
        """The RunRequest fields this group's values fill, by each flag's declaration."""
        return {
            meta.request or f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if (meta := f.metadata[_FLAG]).request is not None
        }


_FLAGS_OF: dict[type[Options], dict[str, Flag]] = {}


def _group_flags(group: type[Options]) -> dict[str, Flag]:
    if group in _FLAGS_OF:
        return _FLAGS_OF[group]
    types = typing.get_type_hints(group)
    out = _FLAGS_OF[group] = {}
    for f in dataclasses.fields(group):  # type: ignore[arg-type]
        meta: FlagText = f.metadata[_FLAG]
        made = typing.cast(Callable[[], Any], f.default_factory)
        default = f.default if f.default is not MISSING else made()
        out[f.name] = Flag(
            name=f.name,
            annotation=meta.annotation if meta.annotation is not None else types[f.name],
            default=default if meta.shown_default is _AS_FIELD else meta.shown_default,
            decls=meta.decls,
            help=meta.help,
            panel=meta.panel or group.PANEL,
            group=group,
            metavar=meta.metavar,
        )
    return out


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
    """Read by the commands themselves (names, paths), not passed whole into the request."""

    PANEL = BACKENDS_PANEL
    backend: str | None = flag(
        None, "Backend(s), comma-separated; see `moelab backends`", "--backend", "-b", metavar="NAME[,NAME…]"
    )
    backend_path: list[str] = flag(
        [],
        "NAME=DIR: put DIR first on PYTHONPATH for backend NAME's job (e.g. its deep_ep build)",
        "--backend-path",
        metavar="NAME=DIR",
    )
    nccl_tests_bin: str | None = flag(
        None,
        f"alltoall_perf (or its folder) for --backend {nccl_tests.BACKEND}; default: PATH",
        "--nccl-tests-bin",
        metavar="PATH",
    )
    kernel_cache: str = flag(
        "auto",
        "Folder where backends that compile kernels on first use (Hybrid-EP) keep them across jobs; "
        "auto: the user's cache folder; off: compile in every job",
        "--kernel-cache",
        metavar="DIR|auto|off",
    )

    def names(self) -> tuple[str, ...]:
        return tuple(parse_list(self.backend, str, "backend") or [])

    def paths(self) -> dict[str, str]:
        return parse_backend_paths(self.backend_path)


def _axis(help: str, metavar: str, item: type, *decls: str, panel: str | None = None) -> Any:
    """A workload axis: comma-separated values of `item` as run takes them (verify one number, tune
    integers: their declarations say so with Flag.but)."""
    return field(
        default=None,
        metadata={
            _FLAG: FlagText(help=help, decls=decls, metavar=metavar, annotation=str | None, panel=panel),
            "item": item,
        },
    )


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions(Options):
    """As the command declares them: run takes comma-separated lists, verify one number, tune integers."""

    PANEL = WORKLOAD_PANEL
    hidden: Any = _axis("Hidden size(s), comma-separated; replaces the suite's", "N[,N…]", int)
    tokens_per_rank: Any = _axis("Tokens per rank, comma-separated", "N[,N…]", int, "--tokens-per-rank")
    topk: Any = _axis("Experts per token, comma-separated", "N[,N…]", int)
    experts_per_rank: Any = _axis("Experts per rank, comma-separated", "N[,N…]", int, "--experts-per-rank")
    routing: Any = _axis(f"Routing kind(s): {', '.join(ROUTING_KINDS)}", "KIND[,KIND…]", str)
    seed: Any = _axis("Routing seed(s)", "N[,N…]", int)
    dtype: Any = _axis("Dispatch payload(s): bf16, fp8, mxfp8", "TYPE[,TYPE…]", str)
    sms: Any = _axis(
        "SM counts, comma-separated ('default' = the library's own choice)",
        "N|default[,…]",
        int,
        panel=BACKENDS_PANEL,
    )

    def axes(self) -> dict[str, list[Any]]:
        """The comma-separated lists given, per workload axis (they replace the suite's)."""
        out = {}
        for f in dataclasses.fields(self):
            parsed = parse_list(getattr(self, f.name), f.metadata["item"], f.name.replace("_", "-"))
            if parsed is not None:
                out[f.name] = parsed
        return out


@dataclass(frozen=True, kw_only=True)
class LaunchOptions(Options):
    PANEL = LAUNCH_PANEL
    gpus: int | None = flag(
        None, "Ranks on this host (default: every local GPU, else 2 CPU ranks)", "--gpus", metavar="N"
    )
    gpus_per_node: int | None = flag(
        None,
        "Ranks per node for byte accounting (default: ranks on this host)",
        "--gpus-per-node",
        metavar="N",
    )
    cpu: bool = flag(False, "Run on CPU ranks (gloo) even when GPUs are present", "--cpu")
    timeout: float = flag(
        900.0,
        "Wall-clock limit of one backend job, seconds; then it is killed and recorded as failed",
        metavar="SECONDS",
        request="timeout_s",
    )
    collective_timeout: float = flag(
        300.0,
        "torch.distributed timeout of a hung collective, seconds",
        "--collective-timeout",
        metavar="SECONDS",
        request="collective_timeout_s",
    )
    launcher: str = flag(
        "local",  # a command without --launcher launches locally; one with it resolves "auto"
        "auto (SLURM inside an allocation, else local), local, torchrun, slurm or mpirun",
        "--launcher",
        metavar="auto|local|torchrun|slurm|mpirun",
        shown_default="auto",
    )
    nodes: int = flag(
        1, "Nodes; with --gpus-per-node, the world size is nodes x gpus-per-node", "--nodes", metavar="N"
    )
    rdzv_endpoint: str | None = flag(
        None,
        "torchrun multi-node: HOST:PORT of the c10d rendezvous (node 0's)",
        "--rdzv-endpoint",
        metavar="HOST:PORT",
    )
    node_rank: int | None = flag(
        None,
        "torchrun multi-node: this node's rank; node 0 hosts the rendezvous and stores the run",
        "--node-rank",
        metavar="N",
    )
    bind: str | None = flag(
        None, "numa: pin each rank to the CPUs and memory of its GPU's NUMA node", "--bind", metavar="numa"
    )
    emulate_internode: bool = flag(
        False,
        "Force NCCL's network (socket) transport between every pair of ranks, as between nodes",
        "--emulate-internode",
    )

    def request_fields(self) -> dict[str, Any]:
        from moelab.job import launchers

        fields_ = super().request_fields()
        if self.launcher == "auto":
            fields_["launcher"] = launchers.auto_launcher(os.environ)
        return fields_


@dataclass(frozen=True, kw_only=True)
class TimingOptions(Options):
    PANEL = TIMING_PANEL
    iters: int | None = flag(
        None,
        "A fixed count of timed iterations per op (default: stop once the median is stable, see --noise-target)",
        metavar="N",
    )
    warmup: int | None = flag(None, "Warm-up iterations per op", metavar="N")
    noise_target: float | None = flag(
        None,
        "Stop timing an op once its median is known within this fraction (default 0.02 on GPU)",
        "--noise-target",
        metavar="FRACTION",
    )
    max_iters: int | None = flag(
        None, "Most timed iterations per op when stopping on noise", "--max-iters", metavar="N"
    )
    repeat: int | None = flag(
        None,
        "Start each backend job N times, in rotated order; each start is a process sample (intervals, "
        "compare and check use the variation between them). Default: the suite's `repeat`, else 1",
        "--repeat",
        metavar="N",
    )


@dataclass(frozen=True, kw_only=True)
class StoreOptions(Options):
    PANEL = STORE_PANEL
    label: str | None = flag(None, "A name for this run (baselines, comparisons)", metavar="NAME")
    db: str | None = flag(None, DB_OPTION_HELP, "--db", metavar="FILE", request=None)
    out: Path | None = flag(
        None,
        "Folder for run directories (default: runs/ in the user's data directory)",
        "--out",
        metavar="DIR",
        request=None,
    )
    report: Path | None = flag(
        None, "Also write the HTML report of this run to this file", "--report", metavar="FILE", request=None
    )
    run_id: str | None = flag(
        None, "Run id (multi-node torchrun: give every node the same one)", "--run-id", metavar="ID"
    )

    def runs_root(self) -> Path:
        """The folder run directories go in: `--out`, else the data directory's `runs/`. A file there is
        refused in one line before any job starts (it was `Not a directory: FILE/RUN`)."""
        from moelab.store.db import data_dir

        root = self.out or (data_dir() / "runs")
        if root.exists() and not root.is_dir():
            raise SpecError(f"--out {root} is a file: give the folder run directories go in")
        return root


@dataclass(frozen=True, kw_only=True)
class TraceOptions(Options):
    PANEL = TRACING_PANEL
    trace: str = flag(
        "none",
        "none, torch (torch.profiler Chrome traces + kernel-only times) or nsys (each rank under nsys profile)",
        "--trace",
        metavar="none|torch|nsys",
    )
    trace_iters: int | None = flag(
        None, "Profiled iterations per op with --trace torch (default 5)", "--trace-iters", metavar="N"
    )
    nsys_osrt: bool = flag(False, "--trace nsys: also trace OS runtime calls", "--nsys-osrt")
    wrap: str | None = flag(
        None,
        "Run each rank under a tool, e.g. 'ncu --profile-from-start off -o {out}'; {out} and {rank} are expanded",
        "--wrap",
        metavar="COMMAND",
    )


@dataclass(frozen=True, kw_only=True)
class HealthOptions(Options):
    PANEL = HEALTH_PANEL
    require_healthy: bool = flag(
        False, "Refuse to start a backend job on a node whose health check fails", "--require-healthy"
    )
    health: bool = flag(
        True, "Health snapshot (NVML, sysfs) before and after each backend job", "--health/--no-health"
    )


@dataclass(frozen=True, kw_only=True)
class SbatchOptions(Options):
    PANEL = LAUNCH_PANEL
    sbatch: bool = flag(
        False,
        "Outside a SLURM allocation: write a batch script that runs this command and submit it",
        "--sbatch",
    )
    partition: str | None = flag(None, "--sbatch: SLURM partition", metavar="NAME", request=None)
    account: str | None = flag(None, "--sbatch: SLURM account", metavar="NAME", request=None)
    time_limit: str | None = flag(
        None,
        "--sbatch: SLURM time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default 00:30:00)",
        "--time",
        metavar="HH:MM:SS",
        request=None,
    )
    container_image: str | None = flag(
        None,
        "--launcher slurm or --sbatch, with pyxis: the container image every rank runs in",
        "--container-image",
        metavar="IMAGE",
        request=None,
    )
    container_mounts: str | None = flag(
        None,
        "--launcher slurm or --sbatch, with pyxis: SRC:DST[,...] mounted into the container",
        "--container-mounts",
        metavar="SRC:DST[,…]",
        request=None,
    )

    def mounts(self) -> tuple[str, ...]:
        return tuple(m for m in (self.container_mounts or "").split(",") if m)

    def check(self) -> None:
        """Each flag that only --sbatch reads, refused without it (a --time given to a run that submits
        nothing was ignored without a word), and the time limit in a form SLURM takes."""
        from moelab.job.launchers import slurm_time_problem

        if not self.sbatch:
            given = [
                name
                for name, value in (
                    ("--partition", self.partition),
                    ("--account", self.account),
                    ("--time", self.time_limit),
                )
                if value is not None
            ]
            if given:
                raise SpecError(
                    f"{', '.join(given)}: read only by --sbatch, for its batch script's header: add --sbatch"
                )
        if self.time_limit is not None and (problem := slurm_time_problem(self.time_limit)):
            raise SpecError(f"--time {self.time_limit!r}: {problem}")
        if self.container_mounts is not None and not self.mounts():
            raise SpecError("--container-mounts names no SRC:DST mount")


# the flags the commands name one by one (by name: inserting a flag into a group moves none of them)
BACKEND, BACKEND_PATH, NCCL_TESTS_BIN = (
    BackendOptions.flag(n) for n in ("backend", "backend_path", "nccl_tests_bin")
)
HIDDEN, TOKENS_PER_RANK, TOPK = (WorkloadOptions.flag(n) for n in ("hidden", "tokens_per_rank", "topk"))
EXPERTS_PER_RANK, ROUTING, SEED = (WorkloadOptions.flag(n) for n in ("experts_per_rank", "routing", "seed"))
DTYPE, SMS = WorkloadOptions.flag("dtype"), WorkloadOptions.flag("sms")
GPUS, CPU, TIMEOUT = (LaunchOptions.flag(n) for n in ("gpus", "cpu", "timeout"))
ITERS, WARMUP, REPEAT = (TimingOptions.flag(n) for n in ("iters", "warmup", "repeat"))
LABEL, DB, OUT, REPORT = (StoreOptions.flag(n) for n in ("label", "db", "out", "report"))
TRACE, HEALTH = TraceOptions.flag("trace"), HealthOptions.flag("health")
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
