"""`--backend nccl-tests`: the user's alltoall_perf at the sizes of the run's cases, as a raw-NCCL baseline
stored beside the EP backends (not a dispatch/combine: no routing, no correctness check of ours)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from moelab.backends.base import HostJob
from moelab.backends.library_test import CommandContext, Comparison, LibraryCommand, LibraryTest, VerifyConfig
from moelab.backends.nccl_tests import (
    BACKEND,
    BINARY,
    aligned_size,
    alltoall_perf_argv,
    find_alltoall_perf,
    parse_text,
    run_alltoall_perf,
)
from moelab.core.case_record import CaseRecord, Figure, NcclTestsRow, OpResult
from moelab.core.errors import BackendUnavailable
from moelab.core.library_figures import LibraryFigure
from moelab.core.routing import route_all
from moelab.core.rows import count_rows
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec
from moelab.core.stats import summarize
from moelab.job.local import JobOutcome
from moelab.job.rundir import JobFiles, now_iso

NAME = BACKEND


def availability(binary: str | None) -> str | None:
    """None when alltoall_perf is found, else find_alltoall_perf's reason, which says what to do."""
    try:
        find_alltoall_perf(binary)
    except Exception as exc:
        return str(exc)
    return None


def case_size_bytes(case: CaseSpec, world: int, gpus_per_node: int) -> int:
    """Per-rank bytes of the case's dispatch (rows sent, own rank included, x bytes/token), as alltoall_perf runs them."""
    wl = case.workload
    rows = count_rows(route_all(wl, world), wl.experts_per_rank, gpus_per_node)
    mean_rows = sum(r.send_rows for r in rows) / len(rows)
    return aligned_size(int(mean_rows * wl.bytes_per_token()), world)


def run_nccl_tests_job(spec: RunSpec, files: JobFiles) -> JobOutcome:
    t0, started = time.monotonic(), now_iso()
    world = spec.launch.world
    cases = [c for c in spec.cases_for(NAME) if not c.skip_reason]
    sizes = {c.case_id: case_size_bytes(c, world, spec.launch.gpus_per_node) for c in cases}
    run = run_alltoall_perf(
        sorted(set(sizes.values())),
        binary=spec.launch.nccl_tests_bin,
        gpus=world,
        timeout_s=spec.launch.job_timeout_s,
    )
    by_size: dict[int, Any] = {}
    for res in run.results:
        for row in res.rows:
            by_size.setdefault(row.size_bytes, (res, row))
    ok = True
    where = {"world": world, "gpus_per_node": spec.launch.gpus_per_node}
    for case in spec.cases_for(NAME):
        if case.skip_reason:
            files.append_result(CaseRecord.skipped(case, case.skip_reason, **where))
            continue
        hit = by_size.get(sizes[case.case_id])
        if hit is None:
            ok = False
            problems = "; ".join(p for r in run.results for p in r.problems) or "no row for this size"
            files.append_result(CaseRecord.failed(case, f"alltoall_perf: {problems}", **where))
            continue
        res, row = hit
        ok = ok and res.ok
        files.append_result(nccl_tests_record(case, row, res, run.binary, where))
    outcome = JobOutcome(
        backend=NAME,
        argv=[run.binary],
        returncode=0 if ok else 1,
        signal=None,
        timed_out=False,
        duration_s=time.monotonic() - t0,
        started_at=started,
    )
    files.write_job(outcome.to_dict())
    return outcome


def nccl_tests_record(case: CaseSpec, row: Any, res: Any, binary: str, where: dict[str, int]) -> CaseRecord:
    """alltoall_perf's line for the case's size: the row itself, and an `alltoall` op whose figures are
    nccl-tests' own algbw and busbw (out-of-place)."""
    status = "ok" if res.ok else "incorrect" if res.status == "wrong" else "failed"
    t = float(row.time_us_oop)
    size = float(row.size_bytes)
    summary = summarize([[t]])  # one figure: every quantile is it
    figures = tuple(
        Figure(definition=name, bytes_mean=size, bytes_max=size, gbps=float(gbps))
        for name, gbps in (("nccl_algbw", row.algbw_gbps_oop), ("nccl_busbw", row.busbw_gbps_oop))
    )
    op = OpResult(op="alltoall", samples_us=((t,),), bytes_per_row=0, summary=summary, figures=figures)
    nccl = NcclTestsRow(
        size_bytes=row.size_bytes,
        count=row.count,
        dtype=row.dtype,
        time_us_oop=t,
        algbw_gbps_oop=row.algbw_gbps_oop,
        busbw_gbps_oop=row.busbw_gbps_oop,
        wrong_oop=row.wrong_oop,
        time_us_ip=row.time_us_ip,
        algbw_gbps_ip=row.algbw_gbps_ip,
        busbw_gbps_ip=row.busbw_gbps_ip,
        wrong_ip=row.wrong_ip,
        avg_busbw_gbps=res.avg_busbw_gbps,
        status=res.status,
        source=res.source or binary,
        argv=tuple(res.argv or ()),
    )
    if status != "ok":
        return CaseRecord.not_measured(case, status, str(res.status), **where)  # type: ignore[arg-type]
    return CaseRecord(
        case=case,
        status="ok",
        ops=(op,),
        nccl_tests=nccl,
        world=where["world"],
        gpus_per_node=where["gpus_per_node"],
    )


FIGURES = ("nccl_algbw", "nccl_busbw")  # nccl-tests' own figures, stored by this job and printed by its tool


def alltoall_perf(
    binary: Path, size_bytes: int, world: int, iters: int = 20, warmup: int = 5
) -> LibraryCommand:
    """alltoall_perf at one size, with the iterations of this backend's job."""
    argv = alltoall_perf_argv(binary, size_bytes, gpus=world, iters=iters, warmup=warmup)
    return LibraryCommand(
        library=NAME, test=BINARY, argv=tuple(argv), log_name=f"nccl_tests_alltoall_perf_{size_bytes}.log"
    )


def figures(text: str, dtype: str) -> list[LibraryFigure]:
    """The out-of-place algbw and busbw of each size (verify runs one size per invocation)."""
    out = []
    for row in parse_text(text).rows:
        for name, gbps in (("algbw", row.algbw_gbps_oop), ("busbw", row.busbw_gbps_oop)):
            if gbps is not None:
                out.append(
                    LibraryFigure(
                        library=NAME,
                        op="alltoall",
                        dtype=dtype,
                        label=f"{row.size_bytes} B {name}",
                        gbps=gbps,
                        time_us=row.time_us_oop,
                        size_bytes=row.size_bytes,
                    )
                )
    return out


class AlltoallPerfTest(LibraryTest):
    """alltoall_perf run again by verify, one per moelab case at that case's bytes (as this job sizes it):
    its out-of-place algbw and busbw against the job's stored `nccl_algbw`, `nccl_busbw`."""

    test = BINARY
    in_tree = False  # found as the job finds it: --nccl-tests-bin, else PATH
    definitions: ClassVar[dict[str, str]] = {
        "nccl_algbw": "nccl-tests alltoall_perf algbw (out-of-place): size / time, size = the per-rank send buffer over all peers",
        "nccl_busbw": "nccl-tests alltoall_perf busbw (out-of-place): algbw x (n-1)/n",
    }

    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        return [
            Comparison(op="alltoall", library_dtype=d, moelab_dtype=d, figure=f)
            for d in self.case_dtypes(config)
            for f in FIGURES
        ]

    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        launch = ctx.spec.launch
        try:
            binary = find_alltoall_perf(launch.nccl_tests_bin)
        except BackendUnavailable:  # a --dry-run on a machine without it: print the command as given
            given = Path(launch.nccl_tests_bin or BINARY)
            binary = given / BINARY if given.is_dir() else given
        return {
            case.workload.dtype: alltoall_perf(
                binary, case_size_bytes(case, launch.world, launch.gpus_per_node), launch.world
            )
            for case in ctx.spec.cases_for(ctx.backend)
            if not case.skip_reason
        }

    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        return figures(text, dtype)

    def matches(self, figure: LibraryFigure, comparison: Comparison) -> bool:
        """Also by the figure's name: algbw for nccl_algbw, busbw for nccl_busbw."""
        named = figure.label.endswith(comparison.figure.removeprefix("nccl_"))
        return named and super().matches(figure, comparison)


class NcclTestsJob(HostJob):
    """A raw-NCCL baseline, not a dispatch/combine: the runner has the launching host run it (its own
    binary launches the GPUs), no moelab ranks."""

    name = NAME
    dispatch_family = "flat"  # alltoall_perf: every rank sends each peer its share
    dispatch_family_source = "nccl-tests alltoall_perf: ncclSend/ncclRecv of an equal share to every peer"
    description = (
        "nccl-tests alltoall_perf at each case's dispatch bytes (raw NCCL baseline; --nccl-tests-bin)"
    )

    library_test: ClassVar[LibraryTest | None] = AlltoallPerfTest()

    @classmethod
    def availability(cls) -> str | None:
        return availability(None)

    @classmethod
    def availability_for(cls, launch: LaunchSpec) -> str | None:
        return availability(launch.nccl_tests_bin)

    @classmethod
    def run_job(cls, spec: RunSpec, files: JobFiles) -> JobOutcome:
        return run_nccl_tests_job(spec, files)
