"""Per backend, through its library test: which of its figures are expected, whether it can run the
configuration, the command(s), and which moelab figure each library figure must equal. `verify_backend`
returns the rows of one backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb

from moelab.backends.library_test import CommandContext, Comparison, LibraryCommand, free_port
from moelab.core.library_figures import LibraryFigure, VerifyRow, judge
from moelab.core.spec import RunSpec
from moelab.job.rundir import RunDir
from moelab.verify import moelab_figures as mf
from moelab.verify.execute import LibraryRun, run_library
from moelab.verify.plan import VerifyRequest, library_test, library_tests


def verify_definitions() -> dict[str, str]:
    """The figures verify derives itself (or takes from a library's job), defined, for table `definitions`."""
    return {name: text for test in library_tests().values() for name, text in test.definitions.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyContext:
    run_id: str
    run_dir: Path
    spec: RunSpec
    world: int
    gpus_per_node: int
    trees: dict[str, Path]  # backend -> library source tree (--backend-path)
    timeout_s: float
    tolerance: float
    connect: Callable[[], duckdb.DuckDBPyConnection]  # read-only connection to the run's store


def expected(backend: str, req: VerifyRequest) -> list[Comparison]:
    return library_test(backend).comparisons(req)


def unsupported_reason(backend: str, req: VerifyRequest, world: int, gpus_per_node: int) -> str | None:
    """Why the library's own test cannot run this configuration (it would trap or assert), or None."""
    test = library_test(backend)
    found = test.unsupported_reason(req, world, gpus_per_node)
    return f"{test.test} cannot run this configuration: {found}" if found else None


def library_commands(
    backend: str, req: VerifyRequest, spec: RunSpec, trees: Mapping[str, Path], master_port: int | None = None
) -> dict[str, LibraryCommand]:
    """Commands keyed by the moelab dtype whose figures they print ('*': all of them)."""
    port = master_port if master_port is not None else free_port()
    ctx = CommandContext(backend=backend, config=req, spec=spec, tree=trees.get(backend), master_port=port)
    return library_test(backend).commands(ctx)


def _run_commands(
    backend: str, req: VerifyRequest, ctx: VerifyContext, progress: Callable[[str], None]
) -> dict[str, LibraryRun]:
    test = library_test(backend).test
    runs: dict[str, LibraryRun] = {}
    for key, cmd in library_commands(backend, req, ctx.spec, ctx.trees).items():
        progress(f"[verify {backend}] {cmd.shell_line()}")
        runs[key] = run_library(cmd, RunDir(ctx.run_dir).verify_dir, ctx.timeout_s)
        run = runs[key]
        progress(f"[verify {backend}] {test}: {run.describe()} ({run.duration_s:.1f} s), log {run.log_path}")
    return runs


def verify_backend(
    backend: str, req: VerifyRequest, ctx: VerifyContext, progress: Callable[[str], None] = print
) -> list[VerifyRow]:
    comparisons = expected(backend, req)
    reason = unsupported_reason(backend, req, ctx.world, ctx.gpus_per_node)
    if reason:
        return [_row(backend, ctx, e, verdict="unsupported", note=reason) for e in comparisons]
    runs = _run_commands(backend, req, ctx, progress)
    with ctx.connect() as con:
        return [
            _compare(con, backend, ctx, e, runs.get("*") or runs.get(e.moelab_dtype)) for e in comparisons
        ]


def _row(backend: str, ctx: VerifyContext, e: Comparison, **kw: object) -> VerifyRow:
    base: dict[str, object] = dict(
        run_id=ctx.run_id,
        backend=backend,
        library_test=library_test(backend).test,
        op=e.op,
        dtype=e.moelab_dtype,
        figure=e.figure,
        case_id=None,
        library_label=None,
        library_gbps=None,
        moelab_gbps=None,
        ratio=None,
        tolerance=ctx.tolerance,
        verdict="error",
        source_log=None,
        note=None,
    )
    return VerifyRow(**(base | kw))  # type: ignore[arg-type]


def _compare(
    con: duckdb.DuckDBPyConnection, backend: str, ctx: VerifyContext, e: Comparison, run: LibraryRun | None
) -> VerifyRow:
    """One comparison's row: the library's figure from its run beside moelab's, with the verdict."""
    test = library_test(backend)
    if run is None:
        return _row(backend, ctx, e, verdict="missing", note="no moelab case to size the library run")
    log = str(run.log_path.relative_to(ctx.run_dir))
    found = [f for f in test.figures(run.text, e.library_dtype) if test.matches(f, e)]
    if not found:
        missing = f"{test.test} printed no {e.op} {e.library_dtype.upper()} figure ({run.describe()}); last lines:\n{run.tail()}"
        return _row(backend, ctx, e, source_log=log, note=missing)
    fig = found[-1]
    case = mf.case_for(con, ctx.run_id, backend, e.moelab_dtype)
    if case is None or case.status != "ok":
        why = f"moelab case {case.status}: {case.reason}" if case else "moelab ran no such case"
        return _row(
            backend,
            ctx,
            e,
            case_id=case.case_id if case else None,
            library_label=fig.label,
            library_gbps=fig.gbps,
            verdict="missing",
            source_log=log,
            note=why,
        )
    moelab_gbps, note = _moelab_gbps(con, ctx.run_id, backend, case.case_id, e, fig)
    ratio, verdict = judge(fig.gbps, moelab_gbps, ctx.tolerance)
    if moelab_gbps is None and e.timing == "kernel":
        verdict = "skipped"
    if verdict == "fail":
        note = (
            test.failure_note(run.text, e)
            or note
            or _host_note(con, ctx.run_id, backend, case.case_id, e, fig, moelab_gbps)
        )
    spread = _spread(con, ctx, backend, case.case_id, e, ratio)
    if spread:
        note = "; ".join(x for x in (note, spread) if x)
    if not run.ok:
        note = "; ".join(x for x in (note, f"library test {run.describe()}") if x)
    return _row(
        backend,
        ctx,
        e,
        case_id=case.case_id,
        library_label=fig.label,
        library_gbps=fig.gbps,
        moelab_gbps=moelab_gbps,
        ratio=ratio,
        verdict=verdict,
        source_log=log,
        note=note,
    )


def _spread(
    con: duckdb.DuckDBPyConnection,
    ctx: VerifyContext,
    backend: str,
    case_id: str,
    e: Comparison,
    ratio: float | None,
) -> str | None:
    """With --repeat: the ratio's range over moelab's starts (its figure is their median's)."""
    if ratio is None or e.timing == "kernel":
        return None
    op = e.op if e.moelab_side == "stored" else mf.first_op(con, ctx.run_id, backend, case_id, e.time_ops)
    if op is None:
        return None
    merged = mf.median_us(con, ctx.run_id, backend, case_id, op)
    medians = mf.process_medians(con, ctx.run_id, backend, case_id, op)
    return mf.spread_note(ratio, merged, medians, ctx.tolerance) if merged else None


def _host_note(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    backend: str,
    case_id: str,
    e: Comparison,
    fig: LibraryFigure,
    moelab_gbps: float | None,
) -> str | None:
    """A mismatch where moelab's own median shows its per-call host work (the library's way is back to back)."""
    if not (moelab_gbps and fig.time_us and e.timing == "api"):
        return None
    median = mf.median_us(con, run_id, backend, case_id, e.op)
    back_to_back = fig.time_us * fig.gbps / moelab_gbps  # the same bytes at moelab's library-way rate
    return mf.back_to_back_note(median, back_to_back, fig.time_us) if median else None


def _moelab_gbps(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, e: Comparison, fig: LibraryFigure
) -> tuple[float | None, str | None]:
    if e.moelab_side == "stored":
        gbps = mf.bandwidth(con, run_id, backend, case_id, e.op, e.figure)
        return gbps, None if gbps is not None else f"moelab stored no {e.figure} for {e.op}"
    # "library_bytes": the library's bytes (GB/s x its time) over moelab's time
    if fig.time_us is None:
        return None, "the library line has no time"
    if e.timing == "kernel":
        op = mf.first_op(con, run_id, backend, case_id, e.time_ops) if e.time_ops else e.op
        t = mf.kernel_us(con, run_id, backend, case_id, op) if op else None
        if t is None:
            return None, "moelab has no kernel-only time for this op: run verify with --trace torch"
    else:
        op = mf.first_op(con, run_id, backend, case_id, e.time_ops)
        t = mf.rank0_mean_us(con, run_id, backend, case_id, op) if op else None
        if t is None:
            return None, "moelab stored no dispatch→combine samples"
    return fig.gbps * fig.time_us / t, None
