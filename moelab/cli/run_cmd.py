"""`moelab run`: build the RunSpec from a suite and flags, launch each backend as its own job, store, print."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import typer

from moelab.backends import registry
from moelab.cli.common import DB_OPTION_HELP, console, parse_list, print_table, user_errors
from moelab.cli.failures import nothing_measured_reason, print_failures
from moelab.errors import MoelabError, SpecError
from moelab.launch import commands
from moelab.launch.rundir import now_iso
from moelab.launch.runner import execute, is_launching_host, new_run_id
from moelab.plan.case_list import print_case_list
from moelab.plan.spec import HealthSpec, LaunchSpec, RunSpec, TimingSpec, TraceSpec
from moelab.plan.validate import dedupe_backends, validate_label, validate_run_id
from moelab.store.db import check_writable, data_dir, open_db, resolve_db_path
from moelab.store.labels import set_label
from moelab.suites.loader import expand, load_suite


def _backend_defaults(names: list[str]) -> dict[str, dict[str, Any]]:
    """Per-backend workload defaults (e.g. the low-latency kernels' own sizes), below the suite's values."""
    out = {}
    for name in names:
        cls = registry.load(name)
        defaults = getattr(cls, "default_workload", None)
        if defaults:
            out[name] = dict(defaults)
    return out


@user_errors
def run(
    backend: str = typer.Option(
        "nccl-a2a", "--backend", "-b", help="Backend(s), comma-separated; see `moelab backends`"
    ),
    suite: str = typer.Option(
        "dispatch-combine", "--suite", "-s", help="Built-in suite name or a suite TOML file"
    ),
    gpus: int | None = typer.Option(
        None, "--gpus", help="Ranks on this host (default: every local GPU, else 2 CPU ranks)"
    ),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", help="Ranks per node for byte accounting (default: ranks on this host)"
    ),
    cpu: bool = typer.Option(False, "--cpu", help="Run on CPU ranks (gloo) even when GPUs are present"),
    hidden: str | None = typer.Option(None, help="Hidden size(s), comma-separated; replaces the suite's"),
    tokens_per_rank: str | None = typer.Option(
        None, "--tokens-per-rank", help="Tokens per rank, comma-separated"
    ),
    topk: str | None = typer.Option(None, help="Experts per token, comma-separated"),
    experts_per_rank: str | None = typer.Option(
        None, "--experts-per-rank", help="Experts per rank, comma-separated"
    ),
    routing: str | None = typer.Option(None, help="Routing kind(s): uniform, zipf, hot"),
    seed: str | None = typer.Option(None, help="Routing seed(s)"),
    dtype: str | None = typer.Option(None, help="Dispatch payload(s): bf16, fp8, mxfp8"),
    sms: str | None = typer.Option(
        None, help="SM counts, comma-separated ('default' = the library's own choice)"
    ),
    iters: int | None = typer.Option(None, help="Timed iterations per op (default: 100 on GPU, 10 on CPU)"),
    warmup: int | None = typer.Option(None, help="Warm-up iterations per op"),
    label: str | None = typer.Option(None, help="A name for this run (baselines, comparisons)"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for run directories (default: runs/ in the user's data directory)"
    ),
    timeout: float = typer.Option(
        900.0, help="Wall-clock limit of one backend job, seconds; then it is killed and recorded as failed"
    ),
    collective_timeout: float = typer.Option(
        300.0, "--collective-timeout", help="torch.distributed timeout of a hung collective, seconds"
    ),
    report: Path | None = typer.Option(
        None, "--report", help="Also write the HTML report of this run to this file"
    ),
    launcher: str = typer.Option(
        "auto",
        "--launcher",
        help="auto (SLURM inside an allocation, else local), local, torchrun, slurm or mpirun",
    ),
    nodes: int = typer.Option(
        1, "--nodes", help="Nodes; with --gpus-per-node, the world size is nodes x gpus-per-node"
    ),
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint", help="torchrun multi-node: HOST:PORT of the c10d rendezvous (node 0's)"
    ),
    node_rank: int | None = typer.Option(
        None,
        "--node-rank",
        help="torchrun multi-node: this node's rank; node 0 hosts the rendezvous and stores the run",
    ),
    run_id: str | None = typer.Option(
        None, "--run-id", help="Run id (multi-node torchrun: give every node the same one)"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the exact launch command(s) (or batch script with --sbatch) and exit"
    ),
    sbatch: bool = typer.Option(
        False,
        "--sbatch",
        help="Outside a SLURM allocation: write a batch script that runs this command and submit it",
    ),
    partition: str | None = typer.Option(None, help="--sbatch: SLURM partition"),
    account: str | None = typer.Option(None, help="--sbatch: SLURM account"),
    time_limit: str = typer.Option("00:30:00", "--time", help="--sbatch: SLURM time limit"),
    container_image: str | None = typer.Option(
        None, "--container-image", help="srun/sbatch with pyxis: container image"
    ),
    container_mounts: str | None = typer.Option(
        None, "--container-mounts", help="srun/sbatch with pyxis: SRC:DST[,...]"
    ),
    backend_path: list[str] = typer.Option(
        [],
        "--backend-path",
        help="NAME=DIR: put DIR first on PYTHONPATH for backend NAME's job (e.g. its deep_ep build)",
    ),
    trace: str = typer.Option(
        "none",
        "--trace",
        help="none, torch (torch.profiler Chrome traces + kernel-only times) or nsys (each rank under nsys profile)",
    ),
    trace_iters: int = typer.Option(5, "--trace-iters", help="Profiled iterations per op with --trace torch"),
    nsys_osrt: bool = typer.Option(False, "--nsys-osrt", help="--trace nsys: also trace OS runtime calls"),
    wrap: str | None = typer.Option(
        None,
        "--wrap",
        help="Run each rank under a tool, e.g. 'ncu --profile-from-start off -o {out}'; {out} and {rank} are expanded",
    ),
    case: list[str] = typer.Option([], "--case", help="Run only these case ids (--list-cases prints them)"),
    list_cases: bool = typer.Option(
        False, "--list-cases", help="Print the case ids this suite, backends and flags expand to, and exit"
    ),
    bind: str | None = typer.Option(
        None, "--bind", help="numa: pin each rank to the CPUs and memory of its GPU's NUMA node"
    ),
    emulate_internode: bool = typer.Option(
        False,
        "--emulate-internode",
        help="Force NCCL's network (socket) transport between every pair of ranks, as between nodes",
    ),
    nccl_tests_bin: str | None = typer.Option(
        None, "--nccl-tests-bin", help="alltoall_perf (or its folder) for --backend nccl-tests; default: PATH"
    ),
    require_healthy: bool = typer.Option(
        False, "--require-healthy", help="Refuse to start a backend job on a node whose health check fails"
    ),
    health: bool = typer.Option(
        True, "--health/--no-health", help="Health snapshot (NVML, sysfs) before and after each backend job"
    ),
    allow_empty: bool = typer.Option(
        False,
        "--allow-empty",
        help="Exit 0 even when every case was unsupported or skipped (nothing measured)",
    ),
) -> None:
    """Run dispatch/combine benchmarks: each backend as its own torchrun job, results stored in DuckDB.

    Example: moelab run --backend nccl-a2a --experts-per-rank 8 --sms default,16,24 --report report.html
    """
    names = dedupe_backends(parse_list(backend, str, "backend") or [])
    run_id = validate_run_id(run_id) if run_id is not None else None
    label = validate_label(label) if label is not None else None
    paths = _parse_backend_paths(backend_path)
    for name in names:
        if name == NCCL_TESTS:
            reason = nccl_tests_availability(nccl_tests_bin)
        else:
            registry.resolve(name)
            reason = registry.availability(name, paths.get(name))
        if reason and not dry_run:
            raise MoelabError(f"backend {name} is unavailable: {reason}")
    if sbatch:
        launcher = "slurm"
    launcher = commands.auto_launcher(os.environ) if launcher == "auto" else launcher
    if launcher not in commands.LAUNCHERS:
        raise SpecError(f"unknown launcher {launcher!r}: choose one of auto, {', '.join(commands.LAUNCHERS)}")
    if trace not in ("none", "torch", "nsys"):
        raise SpecError(f"unknown --trace {trace!r}: choose none, torch or nsys")
    if trace == "nsys" and not dry_run:
        from moelab.tracing.nsys import nsys_available

        found, why = nsys_available()
        if found is None:
            raise MoelabError(f"--trace nsys: {why}")
    if bind not in (None, "numa"):
        raise SpecError(f"unknown --bind {bind!r}: the only binding is numa")
    use_cuda = torch.cuda.is_available() and not cpu
    device = "cuda" if use_cuda else "cpu"
    if nodes < 1:
        raise SpecError(f"--nodes must be >= 1, got {nodes}")
    if nodes > 1 and launcher == "local":
        raise SpecError(f"--nodes {nodes} needs --launcher torchrun, slurm or mpirun (local runs one host)")
    # ranks per node: --gpus on one host; across nodes --gpus-per-node is both the launch and the accounting unit
    nproc = (
        gpus
        or (gpus_per_node if nodes > 1 and gpus_per_node else None)
        or (torch.cuda.device_count() if use_cuda else 2)
    )
    if nproc < 1:
        raise SpecError(f"--gpus must be >= 1, got {nproc}")
    if use_cuda and launcher == "local" and nproc > torch.cuda.device_count():
        raise SpecError(f"--gpus {nproc} but this host has {torch.cuda.device_count()} GPUs")
    if not use_cuda:
        console.print(
            f"no GPU in use ({'--cpu' if cpu else 'CUDA not available'}): running {nproc * nodes} CPU ranks on gloo"
        )
    per_node = gpus_per_node or nproc
    if per_node < 1:
        raise SpecError(f"--gpus-per-node must be >= 1, got {per_node}")
    world = nproc * nodes
    overrides: dict[str, list[Any]] = {}
    for key, value, kind in (
        ("hidden", hidden, int), ("tokens_per_rank", tokens_per_rank, int), ("topk", topk, int),
        ("experts_per_rank", experts_per_rank, int), ("routing", routing, str), ("seed", seed, int),
        ("dtype", dtype, str), ("sms", sms, int),
    ):  # fmt: skip
        parsed = parse_list(value, kind, key.replace("_", "-"))
        if parsed is not None:
            overrides[key] = parsed
    suite_obj = load_suite(suite)
    cases = expand(
        suite_obj, names, world, overrides, _backend_defaults([n for n in names if n != NCCL_TESTS])
    )
    if case:
        unknown = sorted(set(case) - {c.case_id for c in cases})
        if unknown:
            raise SpecError(
                f"no case {unknown[0]!r} in this run; cases are: {', '.join(sorted({c.case_id for c in cases}))[:1500]}"
            )
        cases = [c for c in cases if c.case_id in case]
    if list_cases:
        return print_case_list(cases)
    runnable = [c for c in cases if not c.skip_reason]
    if not runnable:
        raise SpecError(cases[0].skip_reason if cases else f"suite {suite_obj.name} has no cases")
    timing = TimingSpec.for_device(device)
    if iters is not None or warmup is not None:
        timing = TimingSpec(
            warmup=warmup if warmup is not None else timing.warmup, iters=iters if iters is not None else timing.iters,
            pair_reps=timing.pair_reps, pair_iters=timing.pair_iters, flush_l2=timing.flush_l2,
        )  # fmt: skip
        if timing.iters < 1 or timing.warmup < 0:
            raise SpecError("--iters must be >= 1 and --warmup >= 0")
    if trace_iters < 1:
        raise SpecError("--trace-iters must be >= 1")
    spec = RunSpec(
        run_id=run_id or new_run_id(), created_at=now_iso(), suite=suite_obj.name, backends=tuple(names), cases=tuple(cases),
        timing=timing,
        launch=LaunchSpec(device=device, nproc_per_node=nproc, nodes=nodes, gpus_per_node=per_node, launcher=launcher,
                          job_timeout_s=timeout, collective_timeout_s=collective_timeout, rdzv_endpoint=rdzv_endpoint,
                          node_rank=node_rank, backend_paths=paths, bind=bind, emulate_internode=emulate_internode,
                          nccl_tests_bin=nccl_tests_bin),
        label=label, command=tuple(["moelab", *sys.argv[1:]]),
        trace=TraceSpec(mode=trace, iters=trace_iters, nsys_osrt=nsys_osrt, wrap=wrap),
        health=HealthSpec(snapshots=health, require_healthy=require_healthy),
    )  # fmt: skip
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
    if launcher == "torchrun" and nodes > 1 and node_rank is None:
        raise SpecError(
            "torchrun across nodes needs --node-rank on every node (0 on the host that stores the run)"
        )
    db_path = resolve_db_path(db)
    if is_launching_host(spec):
        check_writable(db_path)  # fail now, not after measuring; other nodes never open the database
    console.print(
        f"run {spec.run_id}: {len(runnable)} cases ({len(cases) - len(runnable)} skipped), run directory {runs_root / spec.run_id}"
    )
    outcome = execute(spec, runs_root, db_path, progress=console.print)
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

        path = write_report(db_path, [spec.run_id], report)
        console.print(f"report: {path}")
    if empty:
        console.print(f"error: {empty}")
    if failed or not outcome.all_jobs_ok or empty:
        raise typer.Exit(1)


NCCL_TESTS = "nccl-tests"


def nccl_tests_availability(binary: str | None) -> str | None:
    from moelab.backends.nccl_tests_job import availability

    return availability(binary)


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
    sb = commands.SbatchOptions(
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
        script = commands.sbatch_script(plan, body=body)
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
        if backend == NCCL_TESTS:
            console.print(f"# {backend}: alltoall_perf at the cases' sizes (run by this process)")
            continue
        plan = launch_plan(spec, run_dir, backend)
        argvs = (
            commands.launch_argvs(plan)
            if spec.launch.launcher == "torchrun" and spec.launch.node_rank is None
            else [job_argv(spec, run_dir, backend)]
        )
        for argv in argvs:
            console.print(commands.command_line(argv))


def print_run_summary(db_path: Path, run_id: str) -> int:
    """Print the results table and any failures; returns how many cases failed or were incorrect."""
    with open_db(db_path, read_only=True) as con:
        rows = con.execute(
            """
            SELECT c.backend, c.case_id, r.op, r.median_us, r.p10_us, r.p90_us,
                   max(CASE WHEN b.definition = 'nvl_recv' THEN b.gbps END) AS nvl_gbps,
                   max(CASE WHEN b.definition = 'nvl_remote' THEN b.gbps END) AS remote_gbps
            FROM cases c JOIN results r USING (run_id, backend, case_id)
            LEFT JOIN bandwidths b USING (run_id, backend, case_id, op)
            WHERE c.run_id = ? GROUP BY ALL ORDER BY c.backend, c.case_id, r.op
            """,
            [run_id],
        ).fetchall()
        other = con.execute(
            "SELECT backend, case_id, status, reason FROM cases WHERE run_id = ? AND status <> 'ok' ORDER BY backend, case_id",
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
