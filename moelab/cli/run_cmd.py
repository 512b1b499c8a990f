"""`moelab run`: build the RunSpec from a suite and flags, launch each backend as its own job, store, print."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from moelab.backends import registry
from moelab.backends.base import HostJob
from moelab.cli import options as opt
from moelab.cli.common import console, cuda_devices, interrupted_exit, print_table, user_errors
from moelab.cli.failures import nothing_measured_reason, print_failures
from moelab.cli.output_check import check_output_file, check_outputs
from moelab.core.display import format_pct, format_time_us, safe_text
from moelab.core.errors import MoelabError, SpecError
from moelab.core.models import MODELS
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec
from moelab.job import launchers
from moelab.job.limits import ensure_open_files
from moelab.launch.runner import execute, is_launching_host, new_run_id
from moelab.plan.case_list import case_rows
from moelab.plan.planning import HostFacts, PlannedRun, RunRequest, plan_run
from moelab.store.db import check_writable, open_db, resolve_db_path
from moelab.store.labels import label_conflict, set_label
from moelab.suites.loader import suite_file

if TYPE_CHECKING:
    from moelab.reports.run_view import RunView

SUITE = opt.Flag(
    "suite",
    str,
    "dispatch-combine",
    ("--suite", "-s"),
    "Built-in suite name or a suite TOML file",
    opt.WORKLOAD_PANEL,
    metavar="NAME|FILE",
)
CASE = opt.Flag(
    "case",
    list[str],
    [],
    ("--case",),
    "Run only these case ids (--list-cases prints them)",
    opt.WORKLOAD_PANEL,
    metavar="ID",
)
LIST_CASES = opt.Flag(
    "list_cases",
    bool,
    False,
    ("--list-cases",),
    "Print the case ids this run would measure and exit",
    opt.WORKLOAD_PANEL,
)
MODEL = opt.Flag(
    "model",
    str | None,
    None,
    ("--model",),
    f"A model's MoE layer shape (hidden, topk, experts / ranks, e2e expert width): {', '.join(MODELS)}",
    opt.WORKLOAD_PANEL,
    metavar="MODEL",
)
QUIET = opt.Flag(
    "quiet", bool, False, ("--quiet", "-q"), "No per-case progress while jobs run", opt.LAUNCH_PANEL
)
ALLOW_EMPTY = opt.Flag(
    "allow_empty",
    bool,
    False,
    ("--allow-empty",),
    "Exit 0 even when every case was unsupported or skipped (nothing measured)",
    opt.STORE_PANEL,
)
# in the order of the help panels (Backends and knobs, Workload, Launch, Timing, Store, Tracing, Health); a
# group's flags by name where run's own flags go between them, else the whole group in declaration order
RUN_FLAGS = (
    opt.BACKEND.but(default=registry.DEFAULT_BACKEND),
    opt.SMS,
    *opt.BackendOptions.flags("backend_path", "nccl_tests_bin", "kernel_cache"),
    SUITE,
    *opt.WorkloadOptions.flags("hidden", "tokens_per_rank", "topk", "experts_per_rank", "routing"),
    MODEL,
    *opt.WorkloadOptions.flags("seed", "dtype"),
    CASE,
    LIST_CASES,
    *opt.LaunchOptions.flags(
        "gpus",
        "gpus_per_node",
        "cpu",
        "timeout",
        "collective_timeout",
        "launcher",
        "nodes",
        "rdzv_endpoint",
        "node_rank",
    ),
    opt.DRY_RUN,
    *opt.SbatchOptions.flags(),
    *opt.LaunchOptions.flags("bind", "emulate_internode"),
    QUIET,
    *opt.TimingOptions.flags(),
    *opt.StoreOptions.flags(),
    ALLOW_EMPTY,
    *opt.TraceOptions.flags(),
    *opt.HealthOptions.flags(),
)


@user_errors
@opt.command(*RUN_FLAGS)
def run(
    backends: opt.BackendOptions,
    workload: opt.WorkloadOptions,
    launch: opt.LaunchOptions,
    sbatch: opt.SbatchOptions,
    timing: opt.TimingOptions,
    store: opt.StoreOptions,
    tracing: opt.TraceOptions,
    health: opt.HealthOptions,
    suite: str,
    model: str | None,
    case: list[str],
    list_cases: bool,
    dry_run: bool,
    quiet: bool,
    allow_empty: bool,
) -> None:
    """Run dispatch/combine benchmarks: each backend as its own job, results stored in DuckDB.

    Example: moelab run --backend nccl-a2a --sms default,16,24 --report report.html
    """
    sbatch.check()
    if sbatch.sbatch:
        launch = dataclasses.replace(launch, launcher="slurm")
    req = RunRequest(
        backends=backends.names(),
        suite=suite,
        workload=workload.axes(),
        model=model,
        cases=case,
        backend_paths=backends.paths(),
        nccl_tests_bin=backends.nccl_tests_bin,
        kernel_cache=backends.kernel_cache,
        container_image=sbatch.container_image,
        container_mounts=sbatch.mounts(),
        **launch.request_fields(),
        **timing.request_fields(),
        **store.request_fields(),
        **tracing.request_fields(),
        **health.request_fields(),
        command=["moelab", *sys.argv[1:]],
    )
    planned = plan_run(req, HostFacts(cuda_devices=cuda_devices()), new_run_id=new_run_id())
    spec = planned.spec
    if list_cases:
        return print_case_list(spec.cases, spec.launch)
    if store.report is not None and not dry_run:
        inputs = {"--suite": suite_file(suite), "--nccl-tests-bin": backends.nccl_tests_bin}
        check_outputs(resolve_db_path(store.db), {"--report": store.report}, inputs)
        check_output_file(Path(store.report), "--report")
    for note in planned.notes:
        console.print(note)
    if spec.launch.device == "cpu":
        console.print(f"no GPU in use: running {spec.launch.world} CPU ranks on gloo")
    if not dry_run:
        ensure_open_files()  # before anything opens: `ulimit -n 12` hung the job for its whole --timeout
        check_available(spec)
    if dry_run or sbatch.sbatch:
        return _print_or_submit(spec, store.runs_root(), dry_run, sbatch)
    if spec.launch.launcher == "torchrun" and launch.nodes > 1 and launch.node_rank is None:
        raise SpecError(
            "torchrun across nodes needs --node-rank on every node (0 on the host that stores the run)"
        )
    _measure(planned, store, quiet, allow_empty)


def _check_label_free(db_path: Path, run_id: str, label: str) -> None:
    """`--label` that is another run's id is refused before measuring (set after ingest, it would fail
    once the GPU time was spent). A store this moelab cannot read yet is left to the write path."""
    if not db_path.exists():
        return
    conflict = None
    with contextlib.suppress(MoelabError), open_db(db_path, read_only=True) as con:
        conflict = label_conflict(con, run_id, label)
    if conflict:
        raise MoelabError(conflict)


def _measure(planned: PlannedRun, store: opt.StoreOptions, quiet: bool, allow_empty: bool) -> None:
    """Run the planned jobs, store them, print the results; the exit code says how it went."""
    spec, runs_root = planned.spec, store.runs_root()
    db_path = resolve_db_path(store.db)
    if is_launching_host(spec):
        check_writable(db_path)  # fail now, not after measuring; other nodes never open the database
        if store.label:
            _check_label_free(db_path, spec.run_id, store.label)
    skipped = len(spec.cases) - len(planned.runnable)
    console.print(
        f"run {spec.run_id}: {len(planned.runnable)} cases ({skipped} skipped), run directory {runs_root / spec.run_id}"
    )
    outcome = execute(spec, runs_root, db_path, progress=console.print, quiet=quiet)
    if not outcome.ingested:
        console.print(
            f"node {spec.launch.node_rank}: jobs done; node 0 stores run {spec.run_id} (run directory {outcome.run_dir})"
        )
        raise typer.Exit(0 if outcome.all_jobs_ok else 1)
    if store.label:
        with open_db(db_path) as con:
            set_label(con, spec.run_id, store.label)
    failed, view = print_run_summary(db_path, spec.run_id)
    print_failures(db_path, spec.run_id, view.flag_groups)
    print_answer(view)
    if spec.launch.repeats > 1:
        console.print(
            f"medians: of the {spec.launch.repeats} per-process medians (--repeat), intervals over the processes; "
            f"per start in `python benchmarks/repeat_intervals.py --run {spec.run_id}`"
        )
    empty = None if allow_empty else nothing_measured_reason(db_path, spec.run_id)
    console.print(f"stored run {spec.run_id} in {db_path}")
    if store.report is not None:
        from moelab.reports.html import write_report

        console.print(f"report: {write_report(db_path, [spec.run_id], store.report)}")
    if outcome.interrupted_by:
        console.print(f"run {spec.run_id} was interrupted ({outcome.interrupted_by}): finished cases stored")
        raise interrupted_exit(outcome.interrupted_by)
    if empty:
        console.print(f"error: {empty}")
    for backend, note in outcome.trace_notes.items():
        console.print(
            f"error: {backend}: --trace nsys made no usable trace ({note}); its measurements are stored"
        )
    broken = [f"{name}: {job.describe()}" for name, job in outcome.jobs.items() if not job.ok]
    if failed or broken:  # last, where the exit code is read: the reasons above scroll away under the tables
        why = ([f"{failed} case{'s' if failed != 1 else ''} failed"] if failed else []) + broken
        console.print(f"error: run {spec.run_id} exits 1: {'; '.join(why)}; every finished case is stored")
    if failed or broken or empty or outcome.trace_notes:
        raise typer.Exit(1)


def check_available(spec: RunSpec) -> None:
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


def _print_or_submit(spec: RunSpec, runs_root: Path, dry_run: bool, sbatch: opt.SbatchOptions) -> None:
    """--dry-run: the exact per-backend commands; --sbatch: a batch script running this command under SLURM."""
    from moelab.launch.runner import job_argv, launch_plan

    if sbatch.sbatch:
        _submit(spec, runs_root, dry_run, sbatch)
        return
    run_dir = runs_root / spec.run_id
    if spec.launch.repeats > 1:
        order = ", ".join(f"{b} {k + 1}" for b, k in spec.job_order())
        console.print(
            f"# --repeat {spec.launch.repeats}: each job starts {spec.launch.repeats} times ({order})"
        )
    for backend in spec.backends:
        if issubclass(registry.load(backend), HostJob):
            console.print(f"# {backend}: run by this process on the launching host")
            continue
        plan = launch_plan(spec, run_dir, backend)
        argvs = (
            launchers.launch_argvs(plan)
            if spec.launch.launcher == "torchrun" and spec.launch.node_rank is None
            else [job_argv(spec, run_dir, backend)]
        )
        for argv in argvs:
            console.print(
                launchers.command_line(argv), soft_wrap=True
            )  # a command is copied whole: never wrapped
    if dry_run:
        print_bounds(spec)


def print_bounds(spec: RunSpec) -> None:
    """--dry-run: each planned case's lower-bound dispatch and combine time on the planned topology (moelab
    model), and the published figure its configuration has, if any."""
    from moelab.model.links import PeakTable
    from moelab.model.stored import workload_bound
    from moelab.model.topology import DEFAULT_GPU
    from moelab.reports.bounds import published_for

    launch, table = spec.launch, PeakTable()
    gpu = _local_gpu_name() if launch.device == "cuda" else None
    world = launch.nproc_per_node * launch.nodes
    rows = []
    for case in (c for c in spec.cases if not c.skip_reason):
        wl = case.workload
        family, combine = registry.bound_traits(case.backend, case.knobs)
        b = {
            op: workload_bound(
                wl, family, combine, op, world, launch.gpus_per_node, gpu or DEFAULT_GPU, table
            )
            for op in ("dispatch", "combine")
        }
        fields = {
            "backend": case.backend,
            "world": world,
            "hidden": wl.hidden,
            "tokens_per_rank": wl.tokens_per_rank,
            "topk": wl.topk,
            "experts_per_rank": wl.experts_per_rank,
            "dtype": wl.dtype,
            "routing": wl.routing.kind,
            "routing_params": wl.to_dict()["routing"],
        }
        published = [
            f"{p.op} {p.gbps:g} GB/s {p.definition} ({p.library} {p.commit[:7]})"
            for op in ("dispatch", "combine")
            for p in published_for({**fields, "op": op})
        ]
        rows.append(
            [
                case.backend,
                case.case_id,
                b["dispatch"].family if b["dispatch"] else None,
                b["dispatch"].time_us if b["dispatch"] else None,
                b["combine"].time_us if b["combine"] else None,
                b["dispatch"].bottleneck if b["dispatch"] else None,
                "; ".join(published) or None,
            ]
        )
    where = gpu or f"{DEFAULT_GPU} (no GPU in use here; `moelab model --gpu` for others)"
    print_table(
        ["backend", "case", "family", "dispatch bound µs", "combine bound µs", "bottleneck", "published"],
        rows,
        title=f"lower bound per planned case (moelab model): {launch.nodes} node(s) x {launch.gpus_per_node} ranks, {where}",
    )


def _local_gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def without_flags(argv: Sequence[str], switches: Sequence[str], valued: Sequence[str]) -> list[str]:
    """`argv` less the switches and the flags with their values (`--time 1:00` and `--time=1:00`): what
    the batch script runs inside the allocation, where only --sbatch's own flags mean nothing."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a == "--":
            return out + list(argv[i:])
        elif a in switches or any(a.startswith(f"{v}=") for v in valued):
            continue
        elif a in valued:
            skip = True
        else:
            out.append(a)
    return out


def _submit(spec: RunSpec, runs_root: Path, dry_run: bool, options: opt.SbatchOptions) -> None:
    """A batch script that runs this command under SLURM: printed with --dry-run, else written and submitted."""
    import shutil
    import subprocess

    from moelab.launch.runner import launch_plan

    first = launch_plan(spec, runs_root / spec.run_id, spec.backends[0])
    sb = dataclasses.replace(
        first.sbatch,
        partition=options.partition,
        account=options.account,
        time=options.time_limit or launchers.SbatchOptions().time,
    )
    # the run inside the allocation: without the flags only --sbatch reads, and with the launch this plan
    # resolved in place of the user's own (a flag given twice is refused)
    argv = without_flags(
        spec.command,
        ("--sbatch", "--dry-run"),
        ("--partition", "--account", "--time", "--launcher", "--nodes", "--gpus-per-node", "--run-id"),
    )
    nodes, per_node = str(spec.launch.nodes), str(spec.launch.nproc_per_node)
    body = [
        [*argv, "--launcher", "slurm", "--nodes", nodes, "--gpus-per-node", per_node, "--run-id", spec.run_id]
    ]
    script = launchers.sbatch_script(dataclasses.replace(first, launcher="slurm", sbatch=sb), body=body)
    if dry_run:
        console.print(script, soft_wrap=True)  # a script is copied whole: never wrapped
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


def print_run_summary(db_path: Path, run_id: str) -> tuple[int, RunView]:
    """Print the results table, its marks' legend and the cases not measured; returns how many cases
    failed or were incorrect, and the run's view (the summary printed last, print_answer). Beside the
    bandwidths: % of this machine's measured all-to-all peak and % of moelab model's bound; none of them
    with one rank, where nothing crossed a link."""
    from moelab.reports.run_view import load_view
    from moelab.reports.summary import LEGEND, marks
    from moelab.store.order import case_order

    with open_db(db_path, read_only=True) as con:
        view = load_view(con, run_id)
        other = con.execute(
            f"SELECT backend, case_id, status, reason FROM cases WHERE run_id = ? AND status <> 'ok' ORDER BY {case_order()}",
            [run_id],
        ).fetchall()
    links = any(r["world"] != 1 for r in view.results)
    columns = ["backend", "case", "op", "median µs", "", "p10 µs", "p90 µs"]
    columns += ["NVL GB/s", "remote GB/s", "% measured", "% bound"] if links else []
    rows = []
    for r in view.results:
        row = [r["backend"], r["case_id"], r["op"], r["median_us"], marks(r), r["p10_us"], r["p90_us"]]
        if links:
            row += [
                r["nvl_gbps"],
                r["remote_gbps"],
                format_pct(r["frac_remote_measured"]),
                format_pct(r["frac_bound"]),
            ]
        rows.append(row)
    print_table(columns, rows, title=f"run {run_id}")
    if any(marks(r) for r in view.results):
        console.print(f"marks: {LEGEND}; the reasons are listed below")
    if other:
        print_table(["backend", "case", "status", "reason"], other, title="not measured")
    return sum(1 for r in other if r[2] in ("failed", "incorrect", "crashed", "timeout")), view


def print_answer(view: RunView) -> None:
    """The run's summary, last: per op, payload and workload the backends fastest first with the interval
    that separates them (or says they cannot be told apart), % of the measured peak and of the bound."""
    from moelab.reports.summary import CONTENDED_MARK, SUSPECT_MARK, UNSTABLE_MARK

    rows = []
    for s in view.summary_rows:
        ranking = "\n".join(
            f"{'≈ ' if e.tie else ''}{e.name} {format_time_us(e.estimate.median_us)} "
            f"{('±' + format_pct(e.estimate.half_width)) if e.estimate.known else '(no interval)'}"
            f"{(' ' + e.marks) if e.marks else ''} at {e.sms} SMs{f', knee {e.knee_sms}' if e.knee_sms is not None else ''}"
            for e in s.entries
        )
        flagged = ", ".join(f"{n} {k}" for k, n in s.flagged.items()) or "none"
        rows.append(
            [
                s.op,
                s.dtype,
                s.workload,
                s.answer,
                ranking,
                format_pct(s.frac_measured),
                format_pct(s.frac_bound),
                flagged,
            ]
        )
    if rows:
        print_table(
            ["op", "payload", "workload", "answer", "fastest first", "% measured", "% bound", "flagged"],
            rows,
            title=f"summary: median ±95% interval; ≈ indistinguishable from the fastest; {UNSTABLE_MARK} unstable, {SUSPECT_MARK} suspect, {CONTENDED_MARK} contended",
        )
    for note in view.notes:
        console.print(note)


LIST_TABLE_MAX = 2_000  # cases --list-cases shows as a table; more are printed as tab-separated lines


def print_case_list(cases: Sequence[CaseSpec], launch: LaunchSpec) -> None:
    """A table of `case_rows` on the console; case ids stay on one line, and each reason a case will not
    run (skipped, unsupported here) is said once under the table, by its number."""
    reasons: dict[str, int] = {}
    rows = []
    for backend, case_id, workload, plan in case_rows(cases, launch):
        what, _, why = plan.partition(": ")
        if why:
            plan = f"{what} [{reasons.setdefault(why, len(reasons) + 1)}]"
        rows.append((backend, case_id, workload, plan))
    header = ["backend", "case", "workload", "plan"]
    if len(rows) <= LIST_TABLE_MAX:
        print_table(header, rows)
    else:  # a rich table lays out every row first: 100,000 cases took minutes; one tab-separated line each
        sys.stdout.write("\n".join("\t".join(safe_text(v) for v in r) for r in [header, *rows]) + "\n")
        sys.stdout.flush()
    for why, n in reasons.items():
        console.print(f"[{n}] {why}")
    runs = sum(1 for r in rows if r[3] == "to run")
    console.print(
        f"{len(cases)} cases ({runs} to run, {len(cases) - runs} not); run some with --case ID (repeatable)"
    )
