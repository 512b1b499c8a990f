"""`moelab run`: build the RunSpec from a suite and flags, launch each backend as its own job, store, print."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import typer

from moelab.backends import registry
from moelab.cli.common import DB_OPTION_HELP, console, parse_list, print_table, user_errors
from moelab.cli.failures import nothing_measured_reason, print_failures
from moelab.core.errors import MoelabError, SpecError
from moelab.core.models import MODELS
from moelab.core.spec import CaseSpec, RunSpec
from moelab.job import launchers
from moelab.launch.runner import execute, is_launching_host, new_run_id
from moelab.plan.case_list import case_rows
from moelab.plan.planning import HostFacts, RunRequest, plan_run
from moelab.store.db import check_writable, data_dir, open_db, resolve_db_path
from moelab.store.labels import set_label


@user_errors
def run(
    backend: str = typer.Option(
        "nccl-a2a",
        "--backend",
        "-b",
        help="Backend(s), comma-separated; see `moelab backends`",
        rich_help_panel="Backends and knobs",
    ),
    suite: str = typer.Option(
        "dispatch-combine",
        "--suite",
        "-s",
        help="Built-in suite name or a suite TOML file",
        rich_help_panel="Workload",
    ),
    gpus: int | None = typer.Option(
        None,
        "--gpus",
        help="Ranks on this host (default: every local GPU, else 2 CPU ranks)",
        rich_help_panel="Launch",
    ),
    gpus_per_node: int | None = typer.Option(
        None,
        "--gpus-per-node",
        help="Ranks per node for byte accounting (default: ranks on this host)",
        rich_help_panel="Launch",
    ),
    cpu: bool = typer.Option(
        False, "--cpu", help="Run on CPU ranks (gloo) even when GPUs are present", rich_help_panel="Launch"
    ),
    hidden: str | None = typer.Option(
        None, help="Hidden size(s), comma-separated; replaces the suite's", rich_help_panel="Workload"
    ),
    tokens_per_rank: str | None = typer.Option(
        None, "--tokens-per-rank", help="Tokens per rank, comma-separated", rich_help_panel="Workload"
    ),
    topk: str | None = typer.Option(
        None, help="Experts per token, comma-separated", rich_help_panel="Workload"
    ),
    experts_per_rank: str | None = typer.Option(
        None, "--experts-per-rank", help="Experts per rank, comma-separated", rich_help_panel="Workload"
    ),
    routing: str | None = typer.Option(
        None, help="Routing kind(s): uniform, zipf, hot", rich_help_panel="Workload"
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help=f"A model's MoE layer shape (hidden, topk, experts / ranks, e2e expert width): {', '.join(MODELS)}",
        rich_help_panel="Workload",
    ),
    seed: str | None = typer.Option(None, help="Routing seed(s)", rich_help_panel="Workload"),
    dtype: str | None = typer.Option(
        None, help="Dispatch payload(s): bf16, fp8, mxfp8", rich_help_panel="Workload"
    ),
    sms: str | None = typer.Option(
        None,
        help="SM counts, comma-separated ('default' = the library's own choice)",
        rich_help_panel="Backends and knobs",
    ),
    iters: int | None = typer.Option(
        None,
        help="A fixed count of timed iterations per op (default: stop once the median is stable, see --noise-target)",
        rich_help_panel="Timing",
    ),
    warmup: int | None = typer.Option(None, help="Warm-up iterations per op", rich_help_panel="Timing"),
    label: str | None = typer.Option(
        None, help="A name for this run (baselines, comparisons)", rich_help_panel="Store"
    ),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP, rich_help_panel="Store"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Folder for run directories (default: runs/ in the user's data directory)",
        rich_help_panel="Store",
    ),
    timeout: float = typer.Option(
        900.0,
        help="Wall-clock limit of one backend job, seconds; then it is killed and recorded as failed",
        rich_help_panel="Launch",
    ),
    collective_timeout: float = typer.Option(
        300.0,
        "--collective-timeout",
        help="torch.distributed timeout of a hung collective, seconds",
        rich_help_panel="Launch",
    ),
    report: Path | None = typer.Option(
        None, "--report", help="Also write the HTML report of this run to this file", rich_help_panel="Store"
    ),
    launcher: str = typer.Option(
        "auto",
        "--launcher",
        help="auto (SLURM inside an allocation, else local), local, torchrun, slurm or mpirun",
        rich_help_panel="Launch",
    ),
    nodes: int = typer.Option(
        1,
        "--nodes",
        help="Nodes; with --gpus-per-node, the world size is nodes x gpus-per-node",
        rich_help_panel="Launch",
    ),
    rdzv_endpoint: str | None = typer.Option(
        None,
        "--rdzv-endpoint",
        help="torchrun multi-node: HOST:PORT of the c10d rendezvous (node 0's)",
        rich_help_panel="Launch",
    ),
    node_rank: int | None = typer.Option(
        None,
        "--node-rank",
        help="torchrun multi-node: this node's rank; node 0 hosts the rendezvous and stores the run",
        rich_help_panel="Launch",
    ),
    run_id: str | None = typer.Option(
        None,
        "--run-id",
        help="Run id (multi-node torchrun: give every node the same one)",
        rich_help_panel="Store",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the exact launch command(s) (or batch script with --sbatch) and exit",
        rich_help_panel="Launch",
    ),
    sbatch: bool = typer.Option(
        False,
        "--sbatch",
        help="Outside a SLURM allocation: write a batch script that runs this command and submit it",
        rich_help_panel="Launch",
    ),
    partition: str | None = typer.Option(None, help="--sbatch: SLURM partition", rich_help_panel="Launch"),
    account: str | None = typer.Option(None, help="--sbatch: SLURM account", rich_help_panel="Launch"),
    time_limit: str = typer.Option(
        "00:30:00", "--time", help="--sbatch: SLURM time limit", rich_help_panel="Launch"
    ),
    container_image: str | None = typer.Option(
        None, "--container-image", help="srun/sbatch with pyxis: container image", rich_help_panel="Launch"
    ),
    container_mounts: str | None = typer.Option(
        None, "--container-mounts", help="srun/sbatch with pyxis: SRC:DST[,...]", rich_help_panel="Launch"
    ),
    backend_path: list[str] = typer.Option(
        [],
        "--backend-path",
        help="NAME=DIR: put DIR first on PYTHONPATH for backend NAME's job (e.g. its deep_ep build)",
        rich_help_panel="Backends and knobs",
    ),
    trace: str = typer.Option(
        "none",
        "--trace",
        help="none, torch (torch.profiler Chrome traces + kernel-only times) or nsys (each rank under nsys profile)",
        rich_help_panel="Tracing",
    ),
    trace_iters: int = typer.Option(
        5, "--trace-iters", help="Profiled iterations per op with --trace torch", rich_help_panel="Tracing"
    ),
    nsys_osrt: bool = typer.Option(
        False, "--nsys-osrt", help="--trace nsys: also trace OS runtime calls", rich_help_panel="Tracing"
    ),
    wrap: str | None = typer.Option(
        None,
        "--wrap",
        help="Run each rank under a tool, e.g. 'ncu --profile-from-start off -o {out}'; {out} and {rank} are expanded",
        rich_help_panel="Tracing",
    ),
    case: list[str] = typer.Option(
        [],
        "--case",
        help="Run only these case ids (--list-cases prints them)",
        rich_help_panel="Workload",
    ),
    bind: str | None = typer.Option(
        None,
        "--bind",
        help="numa: pin each rank to the CPUs and memory of its GPU's NUMA node",
        rich_help_panel="Launch",
    ),
    emulate_internode: bool = typer.Option(
        False,
        "--emulate-internode",
        help="Force NCCL's network (socket) transport between every pair of ranks, as between nodes",
        rich_help_panel="Launch",
    ),
    nccl_tests_bin: str | None = typer.Option(
        None,
        "--nccl-tests-bin",
        help="alltoall_perf (or its folder) for --backend nccl-tests; default: PATH",
        rich_help_panel="Backends and knobs",
    ),
    kernel_cache: str = typer.Option(
        "auto",
        "--kernel-cache",
        help="Folder where backends that compile kernels on first use (Hybrid-EP) keep them across jobs; "
        "auto: the user's cache folder; off: compile in every job",
        rich_help_panel="Backends and knobs",
    ),
    require_healthy: bool = typer.Option(
        False,
        "--require-healthy",
        help="Refuse to start a backend job on a node whose health check fails",
        rich_help_panel="Health",
    ),
    health: bool = typer.Option(
        True,
        "--health/--no-health",
        help="Health snapshot (NVML, sysfs) before and after each backend job",
        rich_help_panel="Health",
    ),
    noise_target: float | None = typer.Option(
        None,
        "--noise-target",
        help="Stop timing an op once its median is known within this fraction (default 0.02 on GPU)",
        rich_help_panel="Timing",
    ),
    max_iters: int | None = typer.Option(
        None,
        "--max-iters",
        help="Most timed iterations per op when stopping on noise",
        rich_help_panel="Timing",
    ),
    list_cases: bool = typer.Option(
        False,
        "--list-cases",
        help="Print the case ids this run would measure and exit",
        rich_help_panel="Workload",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No per-case progress while jobs run", rich_help_panel="Launch"
    ),
    allow_empty: bool = typer.Option(
        False,
        "--allow-empty",
        help="Exit 0 even when every case was unsupported or skipped (nothing measured)",
        rich_help_panel="Store",
    ),
) -> None:
    """Run dispatch/combine benchmarks: each backend as its own job, results stored in DuckDB.

    Example: moelab run --backend nccl-a2a --sms default,16,24 --report report.html
    """
    if sbatch:
        launcher = "slurm"
    workload = {
        key: parsed
        for key, value, kind in (
            ("hidden", hidden, int),
            ("tokens_per_rank", tokens_per_rank, int),
            ("topk", topk, int),
            ("experts_per_rank", experts_per_rank, int),
            ("routing", routing, str),
            ("seed", seed, int),
            ("dtype", dtype, str),
            ("sms", sms, int),
        )  # fmt: skip
        if (parsed := parse_list(value, kind, key.replace("_", "-"))) is not None
    }
    req = RunRequest(
        backends=parse_list(backend, str, "backend") or [], suite=suite, workload=workload, cases=case, gpus=gpus,
        gpus_per_node=gpus_per_node, cpu=cpu, nodes=nodes, model=model,
        launcher=launchers.auto_launcher(os.environ) if launcher == "auto" else launcher, iters=iters, warmup=warmup,
        noise_target=noise_target, max_iters=max_iters, label=label, run_id=run_id, timeout_s=timeout,
        collective_timeout_s=collective_timeout, rdzv_endpoint=rdzv_endpoint, node_rank=node_rank,
        backend_paths=_parse_backend_paths(backend_path), trace=trace, trace_iters=trace_iters, nsys_osrt=nsys_osrt,
        wrap=wrap, bind=bind, emulate_internode=emulate_internode, nccl_tests_bin=nccl_tests_bin,
        kernel_cache=kernel_cache, require_healthy=require_healthy, health=health, command=["moelab", *sys.argv[1:]],
    )  # fmt: skip
    planned = plan_run(req, HostFacts(cuda_devices=_cuda_devices()), new_run_id=new_run_id())
    spec = planned.spec
    if list_cases:
        return print_case_list(spec.cases)
    for note in planned.notes:
        console.print(note)
    if spec.launch.device == "cpu":
        console.print(f"no GPU in use: running {spec.launch.world} CPU ranks on gloo")
    if not dry_run:
        _check_available(spec)
    runs_root = out or (data_dir() / "runs")
    if dry_run or sbatch:
        _print_or_submit(
            spec,
            runs_root,
            dry_run,
            sbatch,
            partition,
            account,
            time_limit,
            container_image,
            container_mounts,
        )
        return
    if spec.launch.launcher == "torchrun" and nodes > 1 and node_rank is None:
        raise SpecError(
            "torchrun across nodes needs --node-rank on every node (0 on the host that stores the run)"
        )
    db_path = resolve_db_path(db)
    if is_launching_host(spec):
        check_writable(db_path)  # fail now, not after measuring; other nodes never open the database
    skipped = len(spec.cases) - len(planned.runnable)
    console.print(
        f"run {spec.run_id}: {len(planned.runnable)} cases ({skipped} skipped), run directory {runs_root / spec.run_id}"
    )
    outcome = execute(spec, runs_root, db_path, progress=console.print, quiet=quiet)
    if not outcome.ingested:
        console.print(
            f"node {node_rank}: jobs done; node 0 stores run {spec.run_id} (run directory {outcome.run_dir})"
        )
        raise typer.Exit(0 if outcome.all_jobs_ok else 1)
    if label:
        with open_db(db_path) as con:
            set_label(con, spec.run_id, label)
    failed = print_run_summary(db_path, spec.run_id)
    print_failures(db_path, spec.run_id)
    empty = None if allow_empty else nothing_measured_reason(db_path, spec.run_id)
    console.print(f"stored run {spec.run_id} in {db_path}")
    if report is not None:
        from moelab.reports.html import write_report

        console.print(f"report: {write_report(db_path, [spec.run_id], report)}")
    if outcome.interrupted_by:
        console.print(f"run {spec.run_id} was interrupted ({outcome.interrupted_by}): finished cases stored")
        raise typer.Exit(128 + signal.Signals[outcome.interrupted_by])
    if empty:
        console.print(f"error: {empty}")
    if failed or not outcome.all_jobs_ok or empty:
        raise typer.Exit(1)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_available(spec: RunSpec) -> None:
    """Each backend importable and runnable here (with its --backend-path in a child process), or one line why."""
    if spec.trace.mode == "nsys":
        from moelab.tracing.nsys import nsys_available

        found, why = nsys_available()
        if found is None:
            raise MoelabError(f"--trace nsys: {why}")
    for name in spec.backends:
        reason = registry.availability(name, spec.launch.backend_paths.get(name), launch=spec.launch)
        if reason:
            raise MoelabError(f"backend {name} is unavailable: {reason}")


def _parse_backend_paths(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise SpecError(f"--backend-path takes NAME=DIR, got {v!r}")
        if not Path(path).is_dir():
            raise SpecError(f"--backend-path {name}: {path} is not a directory")
        out[name] = str(Path(path).resolve())
    return out


def _print_or_submit(
    spec: RunSpec, runs_root: Path, dry_run: bool, sbatch: bool, partition: str | None, account: str | None,
    time_limit: str, container_image: str | None, container_mounts: str | None,
) -> None:  # fmt: skip
    """--dry-run: the exact per-backend commands; --sbatch: a batch script running this command under SLURM."""
    import dataclasses
    import shutil
    import subprocess

    from moelab.launch.runner import job_argv, launch_plan

    run_dir = runs_root / spec.run_id
    sb = launchers.SbatchOptions(
        partition=partition, account=account, time=time_limit, container_image=container_image,
        container_mounts=tuple(m for m in (container_mounts or "").split(",") if m),
    )  # fmt: skip
    if sbatch:
        argv = [a for a in spec.command if a not in ("--sbatch", "--dry-run")]
        body = [
            [
                *argv,
                "--launcher",
                "slurm",
                "--nodes",
                str(spec.launch.nodes),
                "--gpus-per-node",
                str(spec.launch.nproc_per_node),
                "--run-id",
                spec.run_id,
            ]
        ]
        plan = dataclasses.replace(launch_plan(spec, run_dir, spec.backends[0]), launcher="slurm", sbatch=sb)
        script = launchers.sbatch_script(plan, body=body)
        if dry_run:
            console.print(script)
            return
        runs_root.mkdir(parents=True, exist_ok=True)
        path = runs_root / f"{spec.run_id}.sbatch"
        path.write_text(script)
        if shutil.which("sbatch") is None:
            raise MoelabError(f"sbatch not found on PATH; the batch script is at {path}")
        done = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise MoelabError(f"sbatch failed: {(done.stderr or done.stdout).strip()}")
        console.print(done.stdout.strip())
        return
    for backend in spec.backends:
        if registry.load(backend).job_kind == "host":
            console.print(f"# {backend}: run by this process on the launching host")
            continue
        plan = launch_plan(spec, run_dir, backend)
        argvs = (
            launchers.launch_argvs(plan)
            if spec.launch.launcher == "torchrun" and spec.launch.node_rank is None
            else [job_argv(spec, run_dir, backend)]
        )
        for argv in argvs:
            console.print(launchers.command_line(argv))


def print_run_summary(db_path: Path, run_id: str) -> int:
    """Print the results table and any failures; returns how many cases failed or were incorrect."""
    from moelab.store.order import case_order, op_order

    with open_db(db_path, read_only=True) as con:
        rows = con.execute(
            f"""
            SELECT c.backend, c.case_id, r.op, r.median_us, r.p10_us, r.p90_us, recv.gbps, remote.gbps
            FROM cases c JOIN results r USING (run_id, backend, case_id)
            LEFT JOIN bandwidths recv ON recv.run_id = r.run_id AND recv.backend = r.backend
                 AND recv.case_id = r.case_id AND recv.op = r.op AND recv.definition = 'nvl_recv'
            LEFT JOIN bandwidths remote ON remote.run_id = r.run_id AND remote.backend = r.backend
                 AND remote.case_id = r.case_id AND remote.op = r.op AND remote.definition = 'nvl_remote'
            WHERE c.run_id = ? ORDER BY {case_order("c")}, {op_order("r.op")}
            """,
            [run_id],
        ).fetchall()
        other = con.execute(
            f"SELECT backend, case_id, status, reason FROM cases WHERE run_id = ? AND status <> 'ok' ORDER BY {case_order()}",
            [run_id],
        ).fetchall()
    print_table(
        ["backend", "case", "op", "median µs", "p10 µs", "p90 µs", "NVL GB/s", "remote GB/s"],
        rows,
        title=f"run {run_id}",
    )
    if other:
        print_table(["backend", "case", "status", "reason"], other, title="not measured")
    return sum(1 for r in other if r[2] in ("failed", "incorrect", "crashed", "timeout"))


def print_case_list(cases: Sequence[CaseSpec]) -> None:
    """A table of `case_rows` on the console; case ids stay on one line."""
    print_table(["backend", "case", "workload", "plan"], case_rows(cases))
    console.print(f"{len(cases)} cases; run some with --case ID (repeatable)")
