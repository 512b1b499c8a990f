"""`moelab run`: build the RunSpec from a suite and flags, launch each backend as its own job, store, print."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import typer

from moelab.backends import registry
from moelab.cli.common import DB_OPTION_HELP, console, parse_list, print_table, user_errors
from moelab.errors import MoelabError, SpecError
from moelab.runner import execute, new_run_id
from moelab.rundir import now_iso
from moelab.spec import LaunchSpec, RunSpec, TimingSpec
from moelab.store.db import check_writable, data_dir, open_db, resolve_db_path
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
    backend: str = typer.Option("nccl-a2a", "--backend", "-b", help="Backend(s), comma-separated; see `moelab backends`"),
    suite: str = typer.Option("dispatch-combine", "--suite", "-s", help="Built-in suite name or a suite TOML file"),
    gpus: int | None = typer.Option(None, "--gpus", help="Ranks on this host (default: every local GPU, else 2 CPU ranks)"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="Ranks per node for byte accounting (default: ranks on this host)"),
    cpu: bool = typer.Option(False, "--cpu", help="Run on CPU ranks (gloo) even when GPUs are present"),
    hidden: str | None = typer.Option(None, help="Hidden size(s), comma-separated; replaces the suite's"),
    tokens_per_rank: str | None = typer.Option(None, "--tokens-per-rank", help="Tokens per rank, comma-separated"),
    topk: str | None = typer.Option(None, help="Experts per token, comma-separated"),
    experts_per_rank: str | None = typer.Option(None, "--experts-per-rank", help="Experts per rank, comma-separated"),
    routing: str | None = typer.Option(None, help="Routing kind(s): uniform, zipf, hot"),
    seed: str | None = typer.Option(None, help="Routing seed(s)"),
    dtype: str | None = typer.Option(None, help="Dispatch payload(s): bf16, fp8, mxfp8"),
    sms: str | None = typer.Option(None, help="SM counts, comma-separated ('default' = the library's own choice)"),
    iters: int | None = typer.Option(None, help="Timed iterations per op (default: 100 on GPU, 10 on CPU)"),
    warmup: int | None = typer.Option(None, help="Warm-up iterations per op"),
    label: str | None = typer.Option(None, help="A name for this run (baselines, comparisons)"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    out: Path | None = typer.Option(None, "--out", help="Folder for run directories (default: runs/ in the user's data directory)"),
    timeout: float = typer.Option(900.0, help="Wall-clock limit of one backend job, seconds; then it is killed and recorded as failed"),
    collective_timeout: float = typer.Option(300.0, "--collective-timeout", help="torch.distributed timeout of a hung collective, seconds"),
    report: Path | None = typer.Option(None, "--report", help="Also write the HTML report of this run to this file"),
) -> None:
    """Run dispatch/combine benchmarks: each backend as its own torchrun job, results stored in DuckDB.

    Example: moelab run --backend nccl-a2a --experts-per-rank 8 --sms default,16,24 --report report.html
    """
    names = parse_list(backend, str, "backend") or []
    for name in names:
        registry.resolve(name)
        reason = registry.availability(name)
        if reason:
            raise MoelabError(f"backend {name} is unavailable: {reason}")
    use_cuda = torch.cuda.is_available() and not cpu
    device = "cuda" if use_cuda else "cpu"
    nproc = gpus or (torch.cuda.device_count() if use_cuda else 2)
    if nproc < 1:
        raise SpecError(f"--gpus must be >= 1, got {nproc}")
    if use_cuda and nproc > torch.cuda.device_count():
        raise SpecError(f"--gpus {nproc} but this host has {torch.cuda.device_count()} GPUs")
    if not use_cuda:
        console.print(f"no GPU in use ({'--cpu' if cpu else 'CUDA not available'}): running {nproc} CPU ranks on gloo")
    per_node = gpus_per_node or nproc
    if per_node < 1:
        raise SpecError(f"--gpus-per-node must be >= 1, got {per_node}")
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
    cases = expand(suite_obj, names, nproc, overrides, _backend_defaults(names))
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
    db_path = resolve_db_path(db)
    check_writable(db_path)  # fail now, not after measuring
    spec = RunSpec(
        run_id=new_run_id(), created_at=now_iso(), suite=suite_obj.name, backends=tuple(names), cases=tuple(cases),
        timing=timing, launch=LaunchSpec(device=device, nproc_per_node=nproc, gpus_per_node=per_node,
                                         job_timeout_s=timeout, collective_timeout_s=collective_timeout),
        label=label, command=tuple(["moelab", *sys.argv[1:]]),
    )  # fmt: skip
    runs_root = out or (data_dir() / "runs")
    console.print(f"run {spec.run_id}: {len(runnable)} cases ({len(cases) - len(runnable)} skipped), run directory {runs_root / spec.run_id}")
    outcome = execute(spec, runs_root, db_path, progress=console.print)
    failed = print_run_summary(db_path, spec.run_id)
    console.print(f"stored run {spec.run_id} in {db_path}")
    if report is not None:
        from moelab.reports.html import write_report

        path = write_report(db_path, [spec.run_id], report)
        console.print(f"report: {path}")
    if failed or not outcome.all_jobs_ok:
        raise typer.Exit(1)


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
    print_table(["backend", "case", "op", "median µs", "p10 µs", "p90 µs", "NVL GB/s", "remote GB/s"], rows, title=f"run {run_id}")
    if other:
        print_table(["backend", "case", "status", "reason"], other, title="not measured")
    return sum(1 for r in other if r[2] in ("failed", "incorrect", "crashed", "timeout"))
