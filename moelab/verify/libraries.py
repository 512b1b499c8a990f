"""Per library: which of its figures are expected, whether it can run the configuration, the command(s),
and which moelab figure each library figure must equal. `verify_backend` returns the rows of one backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb

from moelab.backends import deepep_rules
from moelab.core.library_figures import LibraryFigure, VerifyRow, judge
from moelab.core.spec import RunSpec
from moelab.core.workload import Workload
from moelab.job.rundir import RunDir
from moelab.verify import moelab_figures as mf
from moelab.verify import parse_deepep, parse_hybrid_ep
from moelab.verify.commands import (
    LibraryCommand,
    alltoall_perf,
    deepep_intranode,
    deepep_low_latency,
    free_port,
    hybrid_ep,
)
from moelab.verify.execute import LibraryRun, run_library
from moelab.verify.plan import VerifyRequest, case_dtypes, case_sms

# the moelab definition a library figure must equal, per backend (stored by moelab's ingest)
STORED_FIGURE = {"deepep": "deepep_nvl", "hybrid-ep": "hybrid_ep_rank0_bytes_over_mean_time"}
# figures verify derives itself, from moelab's samples and the library's own bytes (library GB/s x library
# time / moelab time): test_low_latency.py counts every (token, expert) selection, which moelab does not store
LL_PAIR_FIGURE = "deepep_ll_library_bytes_over_rank0_mean_time"
LL_KERNEL_FIGURE = "deepep_ll_library_bytes_over_kernel_time"
VERIFY_DEFINITIONS = {
    LL_PAIR_FIGURE: "DeepEP tests/test_low_latency.py 'Dispatch + combine bandwidth' bytes (every (token, expert) selection: FP8 "
    "dispatch + BF16 combine) over rank 0's mean time after dropping the first iteration of moelab's dispatch→combine pair op",
    LL_KERNEL_FIGURE: "DeepEP tests/test_low_latency.py kernel-only figure's bytes over moelab's kernel-only time of the op "
    "(--trace torch; moelab's is the slowest rank's, the test prints rank 0's)",
    "nccl_algbw": "nccl-tests alltoall_perf algbw (out-of-place): size / time, size = the per-rank send buffer over all peers",
    "nccl_busbw": "nccl-tests alltoall_perf busbw (out-of-place): algbw x (n-1)/n",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Expected:
    """A figure the library's test prints for this request, and the moelab case it belongs to."""

    op: str
    library_dtype: str  # the dtype the parser gives the library's line
    moelab_dtype: str  # the payload of the moelab case it is compared with
    figure: str  # moelab definition
    timing: str = "api"


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyContext:
    run_id: str
    run_dir: Path
    spec: RunSpec
    world: int
    gpus_per_node: int
    trees: dict[str, Path]  # backend -> library source tree (--backend-path)
    nccl_tests_bin: str | None
    timeout_s: float
    tolerance: float
    connect: Callable[[], duckdb.DuckDBPyConnection]  # read-only connection to the run's store


def expected(backend: str, req: VerifyRequest) -> list[Expected]:
    dtypes = case_dtypes(backend, req.dtypes)
    if backend == "deepep":
        combine_case = "bf16" if "bf16" in dtypes else dtypes[0]  # the test's combine line is BF16 only
        return [
            Expected(op="dispatch", library_dtype=d, moelab_dtype=d, figure="deepep_nvl") for d in dtypes
        ] + [Expected(op="combine", library_dtype="bf16", moelab_dtype=combine_case, figure="deepep_nvl")]
    if backend == "hybrid-ep":
        fig = STORED_FIGURE[backend]
        return [
            Expected(op=op, library_dtype=d, moelab_dtype=d, figure=fig)
            for d in dtypes
            for op in ("dispatch", "combine")
        ]
    if backend == "deepep-ll":
        return [
            Expected(op="pair", library_dtype="fp8", moelab_dtype="fp8", figure=LL_PAIR_FIGURE),
            Expected(
                op="dispatch",
                library_dtype="fp8",
                moelab_dtype="fp8",
                figure=LL_KERNEL_FIGURE,
                timing="kernel",
            ),
            Expected(
                op="combine",
                library_dtype="fp8",
                moelab_dtype="fp8",
                figure=LL_KERNEL_FIGURE,
                timing="kernel",
            ),
        ]
    if backend == "nccl-tests":
        return [
            Expected(op="alltoall", library_dtype=d, moelab_dtype=d, figure=f)
            for d in dtypes
            for f in ("nccl_algbw", "nccl_busbw")
        ]
    raise AssertionError(backend)


def library_test(backend: str) -> str:
    return {"deepep": parse_deepep.TEST_INTRANODE, "deepep-ll": parse_deepep.TEST_LOW_LATENCY,
            "hybrid-ep": parse_hybrid_ep.TEST, "nccl-tests": "alltoall_perf"}[backend]  # fmt: skip


def unsupported_reason(backend: str, req: VerifyRequest, world: int, gpus_per_node: int) -> str | None:
    """Why the library's own test cannot run this configuration (it would trap or assert), or None. DeepEP's
    intranode test always runs BF16 dispatch and Hybrid-EP's always runs both payloads, whatever moelab asks."""

    def shape(dtype: str, sms: int | None) -> deepep_rules.Shape:
        return deepep_rules.Shape(hidden=req.hidden, topk=req.topk, tokens_per_rank=req.tokens_per_rank,
                                  experts_per_rank=req.experts_per_rank, dtype=dtype, world=world,
                                  gpus_per_node=gpus_per_node, sms=sms)  # fmt: skip

    sms = case_sms(backend, req.sms)
    if backend == "deepep":
        reasons = [deepep_rules.v1_normal_reason(shape(d, sms)) for d in ("bf16", *req.dtypes)]
    elif backend == "deepep-ll":
        reasons = [deepep_rules.v1_low_latency_reason(shape("fp8", None))]
    elif backend == "hybrid-ep":
        reasons = [deepep_rules.hybrid_ep_reason(shape(d, sms)) for d in ("bf16", "fp8")]
    else:
        reasons = []
    found = next((r for r in reasons if r), None)
    return f"{library_test(backend)} cannot run this configuration: {found}" if found else None


def library_commands(
    backend: str, req: VerifyRequest, spec: RunSpec, trees: Mapping[str, Path], nccl_tests_bin: str | None,
    master_port: int | None = None,
) -> dict[str, LibraryCommand]:  # fmt: skip
    """Commands keyed by the moelab dtype whose figures they print ('*': all of them). nccl-tests runs one
    alltoall_perf per moelab case, at that case's bytes (as moelab's nccl-tests backend sizes it)."""
    world = spec.launch.world
    wl = Workload(
        hidden=req.hidden,
        tokens_per_rank=req.tokens_per_rank,
        topk=req.topk,
        experts_per_rank=req.experts_per_rank,
    )
    port = master_port if master_port is not None else free_port()
    if backend == "deepep":
        return {"*": deepep_intranode(trees[backend], wl, world, master_port=port)}
    if backend == "deepep-ll":
        return {"*": deepep_low_latency(trees[backend], wl, world, master_port=port)}
    if backend == "hybrid-ep":
        return {"*": hybrid_ep(trees[backend], wl, world, case_sms(backend, req.sms), master_port=port)}
    from moelab.backends.nccl_tests import BINARY, find_alltoall_perf
    from moelab.backends.nccl_tests_job import case_size_bytes
    from moelab.core.errors import BackendUnavailable

    try:
        binary = find_alltoall_perf(nccl_tests_bin)
    except BackendUnavailable:  # a --dry-run on a machine without it: print the command as given
        given = Path(nccl_tests_bin or BINARY)
        binary = given / BINARY if given.is_dir() else given
    return {
        case.workload.dtype: alltoall_perf(
            binary, case_size_bytes(case, world, spec.launch.gpus_per_node), world
        )
        for case in spec.cases_for("nccl-tests")
        if not case.skip_reason
    }


def _parse(backend: str, run: LibraryRun, dtype: str) -> list[LibraryFigure]:
    if backend == "deepep":
        return parse_deepep.intranode_figures(run.text)
    if backend == "deepep-ll":
        return parse_deepep.low_latency_figures(run.text)
    if backend == "hybrid-ep":
        return parse_hybrid_ep.figures(run.text)
    from moelab.verify.parse_nccl_tests import figures

    return figures(run.text, dtype)


def verify_backend(
    backend: str, req: VerifyRequest, ctx: VerifyContext, progress: Callable[[str], None] = print
) -> list[VerifyRow]:
    exp = expected(backend, req)
    test = library_test(backend)

    def row(e: Expected, **kw: object) -> VerifyRow:
        base: dict[str, object] = dict(run_id=ctx.run_id, backend=backend, library_test=test, op=e.op, dtype=e.moelab_dtype,
                                       figure=e.figure, case_id=None, library_label=None, library_gbps=None, moelab_gbps=None,
                                       ratio=None, tolerance=ctx.tolerance, verdict="error", source_log=None, note=None)  # fmt: skip
        return VerifyRow(**(base | kw))  # type: ignore[arg-type]

    reason = unsupported_reason(backend, req, ctx.world, ctx.gpus_per_node)
    if reason:
        return [row(e, verdict="unsupported", note=reason) for e in exp]
    commands = library_commands(backend, req, ctx.spec, ctx.trees, ctx.nccl_tests_bin)
    runs: dict[str, LibraryRun] = {}
    for key, cmd in commands.items():
        progress(f"[verify {backend}] {cmd.shell_line()}")
        runs[key] = run_library(cmd, RunDir(ctx.run_dir).verify_dir, ctx.timeout_s)
        progress(
            f"[verify {backend}] {test}: {runs[key].describe()} ({runs[key].duration_s:.1f} s), log {runs[key].log_path}"
        )
    rows = []
    with ctx.connect() as con:
        for e in exp:
            run = runs.get("*") or runs.get(e.moelab_dtype)
            if run is None:
                rows.append(row(e, verdict="missing", note="no moelab case to size the library run"))
                continue
            log = str(run.log_path.relative_to(ctx.run_dir))
            found = [f for f in _parse(backend, run, e.library_dtype)
                     if f.op == e.op and f.dtype == e.library_dtype and f.timing == e.timing
                     and (backend != "nccl-tests" or f.label.endswith(e.figure.removeprefix("nccl_")))]  # fmt: skip
            if not found:
                missing_note = f"{test} printed no {e.op} {e.library_dtype.upper()} figure ({run.describe()}); last lines:\n{run.tail()}"
                rows.append(row(e, source_log=log, note=missing_note))
                continue
            fig = found[-1]
            case = mf.case_for(con, ctx.run_id, backend, e.moelab_dtype)
            case_id = case.case_id if case else None
            if case is None or case.status != "ok":
                why = f"moelab case {case.status}: {case.reason}" if case else "moelab ran no such case"
                rows.append(row(e, case_id=case_id, library_label=fig.label, library_gbps=fig.gbps, verdict="missing",
                                source_log=log, note=why))  # fmt: skip
                continue
            note: str | None
            moelab_gbps, note = _moelab_gbps(con, ctx.run_id, backend, case.case_id, e, fig)
            ratio, verdict = judge(fig.gbps, moelab_gbps, ctx.tolerance)
            if moelab_gbps is None and e.timing == "kernel":
                verdict = "skipped"
            if verdict == "fail" and backend == "hybrid-ep":
                note = parse_hybrid_ep.host_bound_note(run.text, e.op, e.library_dtype) or note
            if verdict == "fail" and note is None and moelab_gbps and fig.time_us and e.timing == "api":
                median = mf.median_us(con, ctx.run_id, backend, case.case_id, e.op)
                b2b = fig.time_us * fig.gbps / moelab_gbps  # the same bytes at moelab's library-way rate
                note = mf.back_to_back_note(median, b2b, fig.time_us) if median else None
            if not run.ok:
                note = "; ".join(x for x in (note, f"library test {run.describe()}") if x)
            rows.append(row(e, case_id=case.case_id, library_label=fig.label, library_gbps=fig.gbps, moelab_gbps=moelab_gbps,
                            ratio=ratio, verdict=verdict, source_log=log, note=note))  # fmt: skip
    return rows


def _moelab_gbps(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, e: Expected, fig: LibraryFigure
) -> tuple[float | None, str | None]:
    if backend in STORED_FIGURE or backend == "nccl-tests":
        gbps = mf.bandwidth(con, run_id, backend, case_id, e.op, e.figure)
        return gbps, None if gbps is not None else f"moelab stored no {e.figure} for {e.op}"
    # deepep-ll: the library's bytes (GB/s x its time) over moelab's time
    if fig.time_us is None:
        return None, "the library line has no time"
    if e.timing == "kernel":
        t = mf.kernel_us(con, run_id, backend, case_id, e.op)
        if t is None:
            return None, "moelab has no kernel-only time for this op: run verify with --trace torch"
    else:
        op = mf.first_op(con, run_id, backend, case_id, ("roundtrip", "pair"))
        t = mf.rank0_mean_us(con, run_id, backend, case_id, op) if op else None
        if t is None:
            return None, "moelab stored no dispatch→combine samples"
    return fig.gbps * fig.time_us / t, None
