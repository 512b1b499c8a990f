"""`moelab verify`: moelab's measurement and each library's own benchmark at the same configuration, their
figures side by side in the same run, a verdict per figure against a tolerance; exit 1 on a mismatch."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from moelab.cli.common import DB_OPTION_HELP, console, parse_list, print_table, user_errors
from moelab.core.errors import SpecError
from moelab.core.library_figures import FAILING, VerifyRow
from moelab.core.spec import RunSpec
from moelab.job.rundir import RunDir
from moelab.launch.runner import new_run_id
from moelab.plan.planning import HostFacts, plan_run
from moelab.store.db import check_writable, connect, data_dir, open_db, resolve_db_path
from moelab.verify import measure
from moelab.verify import store as verify_store
from moelab.verify.libraries import VERIFY_DEFINITIONS, VerifyContext, verify_backend
from moelab.verify.plan import VERIFY_BACKENDS, VerifyRequest, run_request


def _int(value: str, name: str) -> int:
    parsed = parse_list(value, int, name) or []
    if len(parsed) != 1 or not isinstance(parsed[0], int):
        raise SpecError(f"--{name} takes one whole number (verify runs one configuration), got {value!r}")
    return int(parsed[0])


@user_errors
def verify(
    backend: str = typer.Option(
        "deepep,hybrid-ep,nccl-tests",
        "--backend",
        "-b",
        help=f"Backends to verify, comma-separated: {', '.join(VERIFY_BACKENDS)}",
    ),
    backend_path: list[str] = typer.Option(
        [],
        "--backend-path",
        help="NAME=DIR: the library's source tree, built in place (its tests/ are run; DIR goes first on PYTHONPATH); deepep-ll defaults to deepep's",
    ),  # fmt: skip
    nccl_tests_bin: str | None = typer.Option(
        None, "--nccl-tests-bin", help="alltoall_perf (or its folder); default: PATH"
    ),
    hidden: str = typer.Option("8192", help="Hidden size"),
    tokens_per_rank: str = typer.Option("4096", "--tokens-per-rank", help="Tokens per rank"),
    topk: str = typer.Option("8", help="Experts per token"),
    experts_per_rank: str = typer.Option("8", "--experts-per-rank", help="Experts per rank"),
    dtype: str = typer.Option(
        "bf16,fp8", help="Dispatch payloads to compare: bf16, fp8 (deepep-ll: fp8 only)"
    ),
    sms: str | None = typer.Option(
        None, help="SMs (default: each library test's own; DeepEP's intranode test runs 24 only)"
    ),
    tolerance: float = typer.Option(0.05, help="Pass when moelab / library is within 1 ± this"),
    gpus: int | None = typer.Option(None, "--gpus", help="Ranks on this host (default: every local GPU)"),
    cpu: bool = typer.Option(False, "--cpu", help="moelab's side on CPU ranks (gloo)"),
    iters: int | None = typer.Option(None, help="moelab's timed iterations per op"),
    warmup: int | None = typer.Option(None, help="moelab's warm-up iterations per op"),
    trace: str = typer.Option(
        "none", "--trace", help="none or torch (kernel-only times, needed for deepep-ll's kernel figures)"
    ),
    timeout: float = typer.Option(900.0, help="Wall-clock limit of one moelab backend job, seconds"),
    library_timeout: float = typer.Option(
        900.0, "--library-timeout", help="Wall-clock limit of one library benchmark, seconds"
    ),
    health: bool = typer.Option(True, "--health/--no-health", help="Health snapshots around each moelab job"),
    label: str | None = typer.Option(None, help="A name for this run"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print moelab's cases and each library's command, run nothing"
    ),
    report: Path | None = typer.Option(
        None, "--report", help="Also write the HTML report of this run to this file"
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for run directories (default: runs/ in the user's data directory)"
    ),
) -> None:
    """Check moelab's figures against each library's own benchmark at the same configuration.

    Example: moelab verify --backend deepep,hybrid-ep,nccl-tests --backend-path deepep=.ext/deepep-v1
    --backend-path hybrid-ep=.ext/hybrid-ep --nccl-tests-bin .ext/nccl-tests/build --hidden 7168
    """
    from moelab.cli.run_cmd import _cuda_devices, _parse_backend_paths

    names = tuple(parse_list(backend, str, "backend") or [])
    paths = _parse_backend_paths(backend_path)
    if "deepep-ll" in names and "deepep-ll" not in paths and "deepep" in paths:
        paths["deepep-ll"] = paths["deepep"]
    sms_list = parse_list(sms, int, "sms") if sms else None
    if sms_list is not None and (len(sms_list) != 1 or sms_list[0] == "default"):
        raise SpecError(f"--sms takes one SM count (or leave it out for each library's own), got {sms!r}")
    req = VerifyRequest(
        backends=names, hidden=_int(hidden, "hidden"), tokens_per_rank=_int(tokens_per_rank, "tokens-per-rank"),
        topk=_int(topk, "topk"), experts_per_rank=_int(experts_per_rank, "experts-per-rank"),
        dtypes=tuple(parse_list(dtype, str, "dtype") or []), sms=int(sms_list[0]) if sms_list else None,
    )  # fmt: skip
    req.validate()
    if not 0 < tolerance < 1:
        raise SpecError(f"--tolerance must be within (0, 1), got {tolerance}")
    if trace not in ("none", "torch"):
        raise SpecError(f"verify --trace takes none or torch, got {trace!r}")
    if library_timeout <= 0:
        raise SpecError(f"--library-timeout must be > 0, got {library_timeout}")
    run = run_request(req, gpus=gpus, cpu=cpu, iters=iters, warmup=warmup, label=label, timeout_s=timeout,
                      backend_paths=paths, nccl_tests_bin=nccl_tests_bin, trace=trace, health=health,
                      command=("moelab", *sys.argv[1:]))  # fmt: skip
    spec = plan_run(run, HostFacts(cuda_devices=_cuda_devices()), new_run_id=new_run_id()).spec
    if not dry_run:
        measure.check_available(names, paths, nccl_tests_bin)
    if dry_run:
        _print_plan(spec, req, paths, nccl_tests_bin)
        return
    db_path = resolve_db_path(db)
    check_writable(db_path)
    runs_root = out or (data_dir() / "runs")
    console.print(f"verify run {spec.run_id}: {len(spec.cases)} moelab cases, then each library's own test")
    outcome = measure.run_moelab(spec, runs_root, db_path, console.print)
    ctx = VerifyContext(run_id=spec.run_id, run_dir=outcome.run_dir, spec=spec, world=spec.launch.world, gpus_per_node=spec.launch.gpus_per_node,
                        trees={k: Path(v) for k, v in paths.items()}, nccl_tests_bin=nccl_tests_bin,
                        timeout_s=library_timeout, tolerance=tolerance,
                        connect=lambda: connect(db_path, read_only=True))  # fmt: skip
    rows: list[VerifyRow] = []
    for name in names:
        rows += verify_backend(name, req, ctx, progress=console.print)
    RunDir(outcome.run_dir).write_library_figures(rows)
    with open_db(db_path) as con:
        verify_store.store(con, spec.run_id, rows, VERIFY_DEFINITIONS)
    print_verify_rows(rows, f"verify run {spec.run_id} (moelab / library, tolerance ±{tolerance:.0%})")
    console.print(f"stored run {spec.run_id} in {db_path}; library logs in {outcome.run_dir / 'verify'}")
    if report is not None:
        from moelab.reports.html import write_report

        console.print(f"report: {write_report(db_path, [spec.run_id], report)}")
    if any(r.verdict in FAILING for r in rows) or not outcome.all_jobs_ok:
        raise typer.Exit(1)


def print_verify_rows(rows: list[VerifyRow], title: str) -> None:
    print_table(
        ["backend", "op", "dtype", "figure", "library GB/s", "moelab GB/s", "ratio", "verdict", "note"],
        [(r.backend, r.op, r.dtype, r.figure, r.library_gbps, r.moelab_gbps, r.ratio, r.verdict,
          (r.note or "").splitlines()[0][:160] if r.note else None) for r in rows],
        title=title,
    )  # fmt: skip
    for r in rows:
        if r.verdict == "error" and r.note and "\n" in r.note:
            console.print(f"[{r.backend} {r.op} {r.dtype}] {r.note}")


def _print_plan(spec: RunSpec, req: VerifyRequest, paths: dict[str, str], nccl_tests_bin: str | None) -> None:
    from moelab.verify.commands import DEFAULT_MASTER_PORT
    from moelab.verify.libraries import library_commands, unsupported_reason

    for case in spec.cases:
        skip = f"  (skipped: {case.skip_reason})" if case.skip_reason else ""
        console.print(
            f"# moelab {case.backend}: case {case.case_id} sms={case.sms or 'default'} knobs={case.asked_knobs()}{skip}"
        )
    for name in spec.backends:
        reason = unsupported_reason(name, req, spec.launch.world, spec.launch.gpus_per_node)
        if reason:
            console.print(f"# {name}: not run: {reason}")
            continue
        if name != "nccl-tests" and name not in paths:
            console.print(f"# {name}: needs --backend-path {name}=DIR")
            continue
        trees = {k: Path(v) for k, v in paths.items()}
        for cmd in library_commands(name, req, spec, trees, nccl_tests_bin, DEFAULT_MASTER_PORT).values():
            console.print(cmd.shell_line())
