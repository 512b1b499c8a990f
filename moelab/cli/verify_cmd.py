"""`moelab verify`: moelab's measurement and each library's own benchmark at the same configuration, their
figures side by side in the same run, a verdict per figure against a tolerance; exit 1 on a mismatch."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from moelab.backends.library_test import DEFAULT_MASTER_PORT, LibraryTest
from moelab.cli import options as opt
from moelab.cli.common import (
    console,
    cuda_devices,
    interrupted_exit,
    parse_list,
    print_table,
    user_errors,
)
from moelab.cli.output_check import check_outputs
from moelab.core.errors import SpecError
from moelab.core.library_figures import FAILING, VerifyRow
from moelab.core.spec import RunSpec
from moelab.job.rundir import RunDir
from moelab.launch.runner import new_run_id
from moelab.plan.planning import HostFacts, check_positive, plan_run
from moelab.store.db import check_writable, connect, open_db, resolve_db_path
from moelab.verify import measure
from moelab.verify import store as verify_store
from moelab.verify.libraries import (
    VerifyContext,
    library_commands,
    unsupported_reason,
    verify_backend,
    verify_definitions,
)
from moelab.verify.plan import VerifyRequest, library_tests, run_request


def _flags(tests: dict[str, LibraryTest]) -> tuple[opt.Flag, ...]:
    """verify's flags: the shared ones as verify means them (one configuration, moelab's side of it), their
    help naming what the backends' library tests declare."""
    shares = "".join(f"; {n} defaults to {t.tree_from}'s" for n, t in tests.items() if t.tree_from)
    only = "".join(f" ({n}: {', '.join(t.only_dtypes)} only)" for n, t in tests.items() if t.only_dtypes)
    sms = "; ".join(t.sms_note for t in tests.values() if t.sms_note)
    kernel = ", ".join(f"{n}'s" for n, t in tests.items() if t.kernel_figures)
    return (
        opt.BACKEND.but(
            default=",".join(n for n, t in tests.items() if t.by_default),
            help=f"Backends to verify, comma-separated: {', '.join(tests)}",
        ),
        opt.BACKEND_PATH.but(
            help="NAME=DIR: the library's source tree, built in place (its tests/ are run; DIR goes "
            f"first on PYTHONPATH){shares}"
        ),
        opt.NCCL_TESTS_BIN.but(help="alltoall_perf (or its folder); default: PATH"),
        opt.HIDDEN.but(default="8192", help="Hidden size", annotation=str, metavar="N"),
        opt.TOKENS_PER_RANK.but(default="4096", help="Tokens per rank", annotation=str, metavar="N"),
        opt.TOPK.but(default="8", help="Experts per token", annotation=str, metavar="N"),
        opt.EXPERTS_PER_RANK.but(default="8", help="Experts per rank", annotation=str, metavar="N"),
        opt.DTYPE.but(
            default="bf16,fp8", help=f"Dispatch payloads to compare: bf16, fp8{only}", annotation=str
        ),
        opt.SMS.but(help=f"SMs (default: each library test's own; {sms})"),
        opt.Flag(
            "tolerance", float, 0.05, (), "Pass when moelab / library is within 1 ± this", metavar="FRACTION"
        ),
        opt.GPUS.but(help="Ranks on this host (default: every local GPU)"),
        opt.CPU.but(help="moelab's side on CPU ranks (gloo)"),
        opt.ITERS.but(help="moelab's timed iterations per op"),
        opt.WARMUP.but(help="moelab's warm-up iterations per op"),
        opt.REPEAT.but(
            help="Start each moelab job N times: moelab's figure is the median over the starts, and a verdict "
            "within their spread says so"
        ),
        opt.TRACE.but(help=f"none or torch (kernel-only times, needed for {kernel} kernel figures)"),
        opt.TIMEOUT.but(help="Wall-clock limit of one moelab backend job, seconds"),
        opt.Flag(
            "library_timeout",
            float,
            900.0,
            ("--library-timeout",),
            "Wall-clock limit of one library benchmark, seconds",
            metavar="SECONDS",
        ),
        opt.HEALTH.but(help="Health snapshots around each moelab job"),
        opt.LABEL.but(help="A name for this run"),
        opt.DB,
        opt.DRY_RUN.but(help="Print moelab's cases and each library's command, run nothing"),
        opt.REPORT,
        opt.OUT,
    )


def _int(value: str, name: str) -> int:
    parsed = parse_list(value, int, name) or []
    if len(parsed) != 1 or not isinstance(parsed[0], int):
        raise SpecError(f"--{name} takes one whole number (verify runs one configuration), got {value!r}")
    return int(parsed[0])


@user_errors
@opt.command(*_flags(library_tests()), panels=False)
def verify(
    backends: opt.BackendOptions,
    workload: opt.WorkloadOptions,
    launch: opt.LaunchOptions,
    timing: opt.TimingOptions,
    store: opt.StoreOptions,
    tracing: opt.TraceOptions,
    health: opt.HealthOptions,
    tolerance: float,
    library_timeout: float,
    dry_run: bool,
) -> None:
    """Check moelab's figures against each library's own benchmark at the same configuration.

    Example: moelab verify --backend deepep,hybrid-ep,nccl-tests --backend-path deepep=.ext/deepep-v1
    --backend-path hybrid-ep=.ext/hybrid-ep --nccl-tests-bin .ext/nccl-tests/build --hidden 7168
    """
    req, paths = _request(backends, workload)
    if not 0 < tolerance < 1:
        raise SpecError(f"--tolerance must be within (0, 1), got {tolerance}")
    if tracing.trace not in ("none", "torch"):
        raise SpecError(f"verify --trace takes none or torch, got {tracing.trace!r}")
    check_positive("--library-timeout", library_timeout)
    flags: dict[str, Any] = dict(
        **launch.request_fields(),
        **timing.request_fields(),
        **store.request_fields(),
        **tracing.request_fields(),
        **health.request_fields(),
        backend_paths=paths,
        nccl_tests_bin=backends.nccl_tests_bin,
        command=("moelab", *sys.argv[1:]),
    )
    host, run_id = HostFacts(cuda_devices=cuda_devices()), new_run_id()
    spec = plan_run(run_request(req, **flags), host, new_run_id=run_id).spec
    measured = _measured_backends(req, spec)
    if measured != req.backends:
        spec = plan_run(run_request(replace(req, backends=measured), **flags), host, new_run_id=run_id).spec
    if dry_run:
        return _print_plan(spec, req, paths)
    measure.check_available(req.backends, paths, spec.launch)
    rows, run_dir, db_path, jobs_ok = _measure(spec, req, paths, store, tolerance, library_timeout)
    print_verify_rows(rows, f"verify run {spec.run_id} (moelab / library, tolerance ±{tolerance:.0%})")
    console.print(f"stored run {spec.run_id} in {db_path}; library logs in {run_dir / 'verify'}")
    if store.report is not None:
        from moelab.reports.html import write_report

        console.print(f"report: {write_report(db_path, [spec.run_id], store.report)}")
    if any(r.verdict in FAILING for r in rows) or not jobs_ok:
        raise typer.Exit(1)


def _measured_backends(req: VerifyRequest, spec: RunSpec) -> tuple[str, ...]:
    """The backends moelab measures: not one whose library's own test cannot run this configuration (its
    figures would be compared with nothing; DeepEP V1 at hidden 8192 cost a 16 s job on 2 x H200), unless
    that leaves none, when moelab's side still runs so the run and its `unsupported` rows are stored."""
    world, gpn = spec.launch.world, spec.launch.gpus_per_node
    measured = tuple(b for b in req.backends if unsupported_reason(b, req, world, gpn) is None)
    return measured or req.backends


def _request(
    backends: opt.BackendOptions, workload: opt.WorkloadOptions
) -> tuple[VerifyRequest, dict[str, str]]:
    """The configuration verify runs (one whole number per size) and each library's source tree (a test that
    shares another backend's tree gets it when not given its own)."""
    names = backends.names()
    paths = backends.paths()
    for name, test in library_tests().items():
        if name in names and name not in paths and test.tree_from in paths:
            paths[name] = paths[test.tree_from]
    sms_list = parse_list(workload.sms, int, "sms") if workload.sms else None
    if sms_list is not None and (len(sms_list) != 1 or sms_list[0] == "default"):
        raise SpecError(
            f"--sms takes one SM count (or leave it out for each library's own), got {workload.sms!r}"
        )
    req = VerifyRequest(
        backends=names,
        hidden=_int(workload.hidden, "hidden"),
        tokens_per_rank=_int(workload.tokens_per_rank, "tokens-per-rank"),
        topk=_int(workload.topk, "topk"),
        experts_per_rank=_int(workload.experts_per_rank, "experts-per-rank"),
        dtypes=tuple(parse_list(workload.dtype, str, "dtype") or []),
        sms=int(sms_list[0]) if sms_list else None,
    )
    req.validate()
    return req, paths


def _measure(
    spec: RunSpec,
    req: VerifyRequest,
    paths: dict[str, str],
    store: opt.StoreOptions,
    tolerance: float,
    library_timeout: float,
) -> tuple[list[VerifyRow], Path, Path, bool]:
    """moelab's run, then each library's test; the rows stored in the run. (rows, run dir, db, jobs ok)"""
    db_path = resolve_db_path(store.db)
    check_outputs(db_path, {"--report": store.report}, {"--nccl-tests-bin": spec.launch.nccl_tests_bin})
    check_writable(db_path)
    console.print(f"verify run {spec.run_id}: {len(spec.cases)} moelab cases, then each library's own test")
    outcome = measure.run_moelab(spec, store.runs_root(), db_path, console.print)
    if outcome.interrupted_by:  # the user asked to stop: no library benchmark (up to --library-timeout each)
        console.print(
            f"verify run {spec.run_id} was interrupted ({outcome.interrupted_by}): finished cases stored"
        )
        raise interrupted_exit(outcome.interrupted_by)
    ctx = VerifyContext(
        run_id=spec.run_id,
        run_dir=outcome.run_dir,
        spec=spec,
        world=spec.launch.world,
        gpus_per_node=spec.launch.gpus_per_node,
        trees={k: Path(v) for k, v in paths.items()},
        timeout_s=library_timeout,
        tolerance=tolerance,
        connect=lambda: connect(db_path, read_only=True),
    )
    rows = [row for name in req.backends for row in verify_backend(name, req, ctx, progress=console.print)]
    RunDir(outcome.run_dir).write_library_figures(rows)
    with open_db(db_path) as con:
        verify_store.store(con, spec.run_id, rows, verify_definitions())
    return rows, outcome.run_dir, db_path, outcome.all_jobs_ok


def print_verify_rows(rows: list[VerifyRow], title: str) -> None:
    print_table(
        ["backend", "op", "dtype", "figure", "library GB/s", "moelab GB/s", "ratio", "verdict", "note"],
        [
            (
                r.backend,
                r.op,
                r.dtype,
                r.figure,
                r.library_gbps,
                r.moelab_gbps,
                r.ratio,
                r.verdict,
                (r.note or "").splitlines()[0][:160] if r.note else None,
            )
            for r in rows
        ],
        title=title,
    )
    for r in rows:
        if r.verdict == "error" and r.note and "\n" in r.note:
            console.print(f"[{r.backend} {r.op} {r.dtype}] {r.note}")


def _print_plan(spec: RunSpec, req: VerifyRequest, paths: dict[str, str]) -> None:
    for case in spec.cases:
        skip = f"  (skipped: {case.skip_reason})" if case.skip_reason else ""
        console.print(
            f"# moelab {case.backend}: case {case.case_id} sms={case.sms or 'default'} knobs={case.asked_knobs()}{skip}"
        )
    trees = {k: Path(v) for k, v in paths.items()}
    for name in req.backends:  # a library whose test cannot run this configuration says so, unmeasured
        reason = unsupported_reason(name, req, spec.launch.world, spec.launch.gpus_per_node)
        if reason:
            console.print(f"# {name}: not run: {reason}")
            continue
        if library_tests()[name].in_tree and name not in paths:
            console.print(f"# {name}: needs --backend-path {name}=DIR")
            continue
        for cmd in library_commands(name, req, spec, trees, DEFAULT_MASTER_PORT).values():
            console.print(cmd.shell_line(), soft_wrap=True)  # copied whole: never wrapped
