"""Command lines for every launcher, built as argument lists from one typed `LaunchPlan`.

moelab rides on the user's own engine (torchrun, SLURM's srun/sbatch, mpirun) and never grows its
own ssh fan-out. Everything here is pure: the same plan gives the same argv, so `--dry-run` prints
exactly what would run and golden tests pin it. User input never passes through a shell, except in
`sbatch_script`, where every word is quoted with `shlex.quote`.

Ranks started by srun or mpirun learn their torch.distributed identity from the launcher's own
variables: `dist_env_from_slurm` / `dist_env_from_mpi` map them to RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, ... (torchrun sets those itself).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from moelab.core.errors import MoelabError, SpecError

LAUNCHERS = ("local", "slurm", "torchrun", "mpirun")
WORKER_MODULE = "moelab.measure.worker"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCRIPT_REFS = re.compile(r"(\$\{[A-Z_][A-Z0-9_]*\})")


_SLURM_TIME = re.compile(
    r"([0-9]+)-([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?|([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?"
)
SLURM_TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED)"


def slurm_time_problem(text: str) -> str | None:
    """Why `text` is no time limit sbatch takes, or None. The leading figure may be any size (90 minutes,
    36 hours); a figure after it must be a clock digit pair: 99:99:99 is a typo, not a time."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _SLURM_TIME.fullmatch(text)  # whole: `$` would let a trailing newline through
    if m is None:
        return f"not a SLURM time limit: give {SLURM_TIME_FORMS}"
    days, d_hours, d_minutes, d_seconds, lead, second, third = m.groups()
    if days is not None:
        below = [(d_hours, 24, "hours"), (d_minutes, 60, "minutes"), (d_seconds, 60, "seconds")]
    elif third is not None:  # HH:MM:SS
        below = [(second, 60, "minutes"), (third, 60, "seconds")]
    else:  # MM or MM:SS
        below = [(second, 60, "seconds")]
    for figure, limit, unit in below:
        if figure is not None and int(figure) >= limit:
            return f"{unit} {int(figure)} must be under {limit}"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class SbatchOptions:
    """#SBATCH header fields, and pyxis container flags (passed to srun, where pyxis reads them)."""

    job_name: str = "moelab"
    partition: str | None = None
    account: str | None = None
    time: str = "00:30:00"
    output: str = "moelab-%j.out"  # %j: the job id, expanded by SLURM
    exclusive: bool = True  # a benchmark shares no node
    container_image: str | None = None  # pyxis: --container-image
    container_mounts: tuple[str, ...] = ()  # pyxis: --container-mounts SRC:DST[,...]


@dataclass(frozen=True, kw_only=True, slots=True)
class NsysWrap:
    """Profile each rank with Nsight Systems; one report per rank, named by the launcher's rank variable."""

    argv: tuple[str, ...] = ("nsys", "profile", "--trace=cuda,nvtx", "--force-overwrite=true")
    output: str = "moelab"  # report base name; "_rank%q{VAR}" is appended


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchPlan:
    """Everything a launcher needs. `gpus_per_node` is the number of ranks per node (one GPU each;
    on CPU, one gloo process each) and defines node membership for byte accounting."""

    launcher: str = "local"
    nodes: int = 1
    gpus_per_node: int = 1
    device: str = "cuda"  # "cpu": no GPU request to srun
    python: str = "python3"
    worker_module: str = WORKER_MODULE
    worker_args: tuple[str, ...] = ()  # after `-m moelab.measure.worker`: RUN_DIR BACKEND
    rdzv_endpoint: str | None = None  # host:port; torchrun c10d store, or MASTER_ADDR:PORT for mpirun
    rdzv_id: str = "moelab"  # torchrun --rdzv-id: the same on every node (the run id)
    node_rank: int | None = None  # torchrun: make node 0 host the rendezvous store
    hosts: tuple[str, ...] = ()  # mpirun: -H host:slots,... (empty: the MPI default / its hostfile)
    hostfile: str | None = None  # mpirun --hostfile
    env: Mapping[str, str] = field(default_factory=dict)  # passed to every rank
    sbatch: SbatchOptions = field(default_factory=SbatchOptions)
    nsys: NsysWrap | None = None
    max_restarts: int = 0  # a restart changes the conditions: treat it as a failure
    monitor_interval_s: float = 0.5

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def validate(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise SpecError(f"unknown launcher {self.launcher!r}: choose one of auto, {', '.join(LAUNCHERS)}")
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.device not in ("cuda", "cpu"):
            raise SpecError(f"device must be cuda or cpu, got {self.device!r}")
        if self.launcher == "local" and self.nodes != 1:
            raise SpecError(
                f"the local launcher runs one node, got --nodes {self.nodes}: use --launcher slurm, torchrun or mpirun"
            )
        if self.node_rank is not None and not 0 <= self.node_rank < self.nodes:
            raise SpecError(f"node-rank must be within [0, {self.nodes - 1}], got {self.node_rank}")
        if self.rdzv_endpoint is not None:
            split_endpoint(self.rdzv_endpoint)
        for key, value in self.env.items():
            if not _ENV_NAME.match(key):
                raise SpecError(f"invalid environment variable name {key!r}")
            if "\n" in value or "\0" in value:
                raise SpecError(f"environment variable {key} holds a newline or NUL")


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"rendezvous endpoint must be HOST:PORT, got {endpoint!r}")
    return host.strip("[]"), int(port)


def auto_launcher(environ: Mapping[str, str]) -> str:
    """SLURM inside an allocation (SLURM_JOB_ID set: salloc, sbatch, or an srun step), else local."""
    return "slurm" if environ.get("SLURM_JOB_ID") else "local"


def _program(plan: LaunchPlan, rank_var: str) -> list[str]:
    """The per-rank program: python -m moelab.measure.worker ..., optionally under nsys (one report per rank)."""
    program = [plan.python, "-m", plan.worker_module, *plan.worker_args]
    if plan.nsys is None:
        return program
    return [*plan.nsys.argv, "-o", f"{plan.nsys.output}_rank%q{{{rank_var}}}", *program]


def _torchrun_tail(plan: LaunchPlan) -> list[str]:
    common = [
        "--max-restarts",
        str(plan.max_restarts),
        "--monitor-interval",
        f"{plan.monitor_interval_s:g}",
    ]
    if plan.nsys is None:
        return [*common, "-m", plan.worker_module, *plan.worker_args]
    # --no-python: torchrun execs the entrypoint (nsys) itself; each rank has RANK in its environment
    return [*common, "--no-python", *_program(plan, "RANK")]


def torchrun_local_argv(plan: LaunchPlan) -> list[str]:
    """One host: torchrun --standalone (a private rendezvous on a free port)."""
    plan.validate()
    return [
        plan.python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(plan.gpus_per_node),
        *_torchrun_tail(plan),
    ]


def torchrun_multinode_argv(plan: LaunchPlan) -> list[str]:
    """The command every node runs: c10d rendezvous at `rdzv_endpoint`.

    torchrun ignores --node-rank with c10d (it warns): nodes get their group rank in the order they join,
    and rank = group_rank x nproc + local_rank keeps each node's ranks contiguous, which is all the byte
    accounting needs. `node_rank` here only decides which node hosts the rendezvous store
    (`is_host`), so the host is chosen, not guessed from hostnames.
    """
    plan.validate()
    if plan.rdzv_endpoint is None:
        raise SpecError("torchrun across nodes needs --rdzv-endpoint HOST:PORT (a host all nodes can reach)")
    argv = [
        plan.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(plan.nodes),
        "--nproc-per-node",
        str(plan.gpus_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        plan.rdzv_endpoint,
        "--rdzv-id",
        plan.rdzv_id,
    ]
    if plan.node_rank is not None:
        argv += ["--rdzv-conf", f"is_host={'true' if plan.node_rank == 0 else 'false'}"]
    return argv + _torchrun_tail(plan)


def _export_arg(plan: LaunchPlan) -> list[str]:
    if not plan.env:
        return []
    for key, value in plan.env.items():
        if "," in value:
            raise SpecError(f"srun --export cannot carry a comma in {key}={value!r}")
    return ["--export=" + ",".join(["ALL", *(f"{k}={v}" for k, v in sorted(plan.env.items()))])]


def srun_argv(plan: LaunchPlan) -> list[str]:
    """Inside an allocation: one srun step, one task per rank; ranks map SLURM_* with dist_env_from_slurm."""
    plan.validate()
    argv = [
        "srun",
        "--nodes",
        str(plan.nodes),
        "--ntasks-per-node",
        str(plan.gpus_per_node),
        "--ntasks",
        str(plan.world),
    ]
    if plan.device == "cuda":
        argv += ["--gpus-per-node", str(plan.gpus_per_node)]
    argv += ["--kill-on-bad-exit=1"]
    if plan.sbatch.container_image is not None:
        argv += ["--container-image", plan.sbatch.container_image]
    if plan.sbatch.container_mounts:
        argv += ["--container-mounts", ",".join(plan.sbatch.container_mounts)]
    return argv + _export_arg(plan) + _program(plan, "SLURM_PROCID")


def mpirun_argv(plan: LaunchPlan) -> list[str]:
    """OpenMPI mpirun: G ranks per node, packed by node so each node's ranks are contiguous."""
    plan.validate()
    if plan.rdzv_endpoint is None:
        raise SpecError("mpirun needs --rdzv-endpoint HOST:PORT: the first node's address, for MASTER_ADDR")
    host, port = split_endpoint(plan.rdzv_endpoint)
    argv = [
        "mpirun",
        "-np",
        str(plan.world),
        "--map-by",
        f"ppr:{plan.gpus_per_node}:node",
        "--bind-to",
        "none",
    ]
    if plan.hostfile is not None:
        argv += ["--hostfile", plan.hostfile]
    elif plan.hosts:
        argv += ["-H", ",".join(f"{h}:{plan.gpus_per_node}" for h in plan.hosts)]
    env = {"MASTER_ADDR": host, "MASTER_PORT": str(port), **plan.env}
    for key in sorted(env):
        argv += ["-x", f"{key}={env[key]}"]
    return argv + _program(plan, "OMPI_COMM_WORLD_RANK")


def launch_argvs(plan: LaunchPlan) -> list[list[str]]:
    """The exact commands for `plan` (`--dry-run`): one, except torchrun across nodes without a node rank,
    which gives one per node (node r runs the r-th; they differ only in which one hosts the store)."""
    if plan.launcher == "local":
        return [torchrun_local_argv(plan)]
    if plan.launcher == "slurm":
        return [srun_argv(plan)]
    if plan.launcher == "mpirun":
        return [mpirun_argv(plan)]
    if plan.node_rank is not None:
        return [torchrun_multinode_argv(plan)]
    return [torchrun_multinode_argv(dataclasses.replace(plan, node_rank=r)) for r in range(plan.nodes)]


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """A shell-quoted line for display (`--dry-run`), with env assignments in front."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    return " ".join([*prefix, shlex.join(argv)])


def _script_word(word: str, params: Sequence[str]) -> str:
    """Quote `word` for bash; `${NAME}` for a declared script parameter stays expandable."""
    if params and "${" in word:
        parts = _SCRIPT_REFS.split(word)
        literals, refs = parts[0::2], parts[1::2]
        if all(r[2:-1] in params for r in refs) and not any("$" in lit for lit in literals):
            escaped = [
                p if i % 2 else p.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
                for i, p in enumerate(parts)
            ]
            return '"' + "".join(escaped) + '"'
    return shlex.quote(word)


CLI_MODULE = "moelab.cli.main"


def cli_by_interpreter(argv: Sequence[str], python: str) -> list[str]:
    """A command starting with the bare `moelab` entry point, run as `PYTHON -m moelab.cli.main` instead:
    a batch job starts with the compute node's PATH, where the entry point of the submitting environment
    usually is not (as the srun lines already name the interpreter). Other commands are unchanged."""
    if argv and argv[0] == "moelab":
        return [python, "-m", CLI_MODULE, *argv[1:]]
    return list(argv)


def sbatch_script(
    plan: LaunchPlan, body: Sequence[Sequence[str]] | None = None, script_params: Sequence[str] = ()
) -> str:
    """A batch script for `sbatch` (submission from outside an allocation).

    `body`: the commands to run, default the worker's srun step; a body command that starts with `moelab`
    runs as `plan.python -m moelab.cli.main` (`cli_by_interpreter`). `script_params`: names bound to the
    script's positional arguments (`sbatch x.sbatch /runs/r1 nccl-a2a`); `${NAME}` of one of them inside
    a word is expanded (in double quotes), everything else is quoted literally.
    """
    plan.validate()
    for name in script_params:
        if not re.match(r"^[A-Z_][A-Z0-9_]*$", name):
            raise SpecError(f"script parameter names are upper-case shell names, got {name!r}")
    s = plan.sbatch
    header = [
        f"--job-name={s.job_name}",
        f"--nodes={plan.nodes}",
        f"--ntasks-per-node={plan.gpus_per_node}",
    ]
    if plan.device == "cuda":
        header.append(f"--gpus-per-node={plan.gpus_per_node}")
    header.append(f"--time={s.time}")
    if s.partition is not None:
        header.append(f"--partition={s.partition}")
    if s.account is not None:
        header.append(f"--account={s.account}")
    header.append(f"--output={s.output}")
    if s.exclusive:
        header.append("--exclusive")
    for line in header:
        if "\n" in line:
            raise SpecError(f"sbatch option holds a newline: {line!r}")
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(h)}" for h in header)]
    lines += ["# written by moelab (moelab.job.launchers.sbatch_script)", "set -euo pipefail"]
    if script_params:
        usage = " ".join(script_params)
        for i, name in enumerate(script_params, start=1):
            lines.append(f'{name}="${{{i}:?usage: sbatch $0 {usage}}}"')
    for argv in body if body is not None else [srun_argv(plan)]:
        lines.append(" ".join(_script_word(w, script_params) for w in cli_by_interpreter(argv, plan.python)))
    return "\n".join(lines) + "\n"


# --- ranks: the launcher's variables -> torch.distributed's -------------------------------------------


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM hostlist ("node[01-03,07],gpu5", "r[1-2]-n[1-2]") in order, keeping zero padding.

    python-hostlist does this too, but it is GPL; this covers the syntax SLURM_JOB_NODELIST uses.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_one(item, hostlist))
    if not hosts:
        raise MoelabError(f"empty hostlist {hostlist!r}")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [it for it in items if it]


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if m is None:
        if "[" in item or "]" in item:
            raise MoelabError(f"unbalanced brackets in hostlist {whole!r}")
        return [item]
    prefix, suffix = item[: m.start()], item[m.end() :]
    out = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise MoelabError(f"bad range {part!r} in hostlist {whole!r}")
        width = len(lo)
        lo_n, hi_n = int(lo), int(hi) if sep else int(lo)
        if hi_n < lo_n:
            raise MoelabError(f"descending range {part!r} in hostlist {whole!r}")
        for n in range(lo_n, hi_n + 1):
            out.extend(_expand_one(f"{prefix}{n:0{width}d}{suffix}", whole))
    return out


def expand_tasks_per_node(spec: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ("2(x3),1") -> [2, 2, 2, 1]."""
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise MoelabError(f"cannot parse SLURM tasks per node {spec!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def default_master_port(job_id: int, step_id: int) -> int:
    """A port in [20000, 30000) from the job and step ids, so concurrent jobs on a node rarely collide."""
    return 20000 + (job_id * 10 + step_id) % 10000


def _need(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    raise MoelabError(f"{' or '.join(names)} is not set: was this rank started by the launcher?")


def _int(environ: Mapping[str, str], *names: str) -> int:
    value = _need(environ, *names)
    if not value.isdigit():
        raise MoelabError(f"{names[0]}={value!r} is not a non-negative integer")
    return int(value)


def dist_env_from_slurm(environ: Mapping[str, str]) -> dict[str, str]:
    """RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK/MASTER_ADDR/MASTER_PORT for a task of an srun step.

    MASTER_ADDR is the step's first host (SLURM_STEP_NODELIST, else the job's: a step may use a subset of
    the allocation); MASTER_PORT is kept if the launcher exported one, else derived from the job and step ids.
    """
    rank = _int(environ, "SLURM_PROCID")
    world = _int(environ, "SLURM_NTASKS", "SLURM_NPROCS")
    local_rank = _int(environ, "SLURM_LOCALID")
    node_id = _int(environ, "SLURM_NODEID")
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "")
    if per_node.isdigit():
        local_world = int(per_node)
    else:
        counts = expand_tasks_per_node(_need(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
        if node_id >= len(counts):
            raise MoelabError(f"SLURM_NODEID {node_id} outside the tasks-per-node list {counts}")
        local_world = counts[node_id]
    nodelist = _need(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if not rank < world or not local_rank < local_world:
        raise MoelabError(
            f"inconsistent SLURM ranks: procid {rank} of {world}, localid {local_rank} of {local_world}"
        )
    port = environ.get("MASTER_PORT") or str(
        default_master_port(_int(environ, "SLURM_JOB_ID"), int(environ.get("SLURM_STEP_ID", "0") or 0))
    )
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node_id),
        "MASTER_ADDR": expand_hostlist(nodelist)[0],
        "MASTER_PORT": port,
    }


def dist_env_from_mpi(
    environ: Mapping[str, str], *, world_size: int | None = None, local_world_size: int | None = None
) -> dict[str, str]:
    """torch.distributed variables for a rank started by mpirun.

    OpenMPI (OMPI_COMM_WORLD_*), MPICH/Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), or
    bare PMIx (PMIX_RANK only: the sizes come from the run spec, and the local rank from the packed
    by-node mapping mpirun_argv asks for). MASTER_ADDR/MASTER_PORT come from the launch (mpirun -x).
    """
    if environ.get("OMPI_COMM_WORLD_RANK"):
        rank = _int(environ, "OMPI_COMM_WORLD_RANK")
        world = _int(environ, "OMPI_COMM_WORLD_SIZE")
        local_rank = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK")
        local_world = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE")
    elif environ.get("PMI_RANK"):
        rank = _int(environ, "PMI_RANK")
        world = _int(environ, "PMI_SIZE")
        local_rank = _int(environ, "MPI_LOCALRANKID")
        local_world = _int(environ, "MPI_LOCALNRANKS")
    elif environ.get("PMIX_RANK"):
        rank = _int(environ, "PMIX_RANK")
        if world_size is None or local_world_size is None:
            raise MoelabError(
                "only PMIX_RANK is set: the world and per-node sizes must come from the run spec"
            )
        world, local_world = world_size, local_world_size
        local_rank = rank % local_world
    else:
        raise MoelabError(
            "no MPI rank variable (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK): not started by mpirun?"
        )
    if not rank < world or not local_rank < local_world:
        raise MoelabError(
            f"inconsistent MPI ranks: rank {rank} of {world}, local {local_rank} of {local_world}"
        )
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "MASTER_ADDR": _need(environ, "MASTER_ADDR"),
        "MASTER_PORT": _need(environ, "MASTER_PORT"),
    }
