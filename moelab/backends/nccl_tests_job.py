"""`--backend nccl-tests`: the user's alltoall_perf at the sizes of the run's cases, as a raw-NCCL baseline
stored beside the EP backends (not a dispatch/combine: no routing, no correctness check of ours)."""

from __future__ import annotations

import time
from typing import Any

import torch

from moelab.backends.base import Backend, Dispatched
from moelab.backends.nccl_tests import aligned_size, find_alltoall_perf, run_alltoall_perf
from moelab.core.case_record import CaseRecord, Figure, NcclTestsRow, OpResult, Summary
from moelab.core.routing import route_all
from moelab.core.rows import count_rows
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec
from moelab.job.local import JobOutcome
from moelab.job.rundir import JobFiles, now_iso

NAME = "nccl-tests"


def availability(binary: str | None) -> str | None:
    try:
        find_alltoall_perf(binary)
    except Exception as exc:
        return f"alltoall_perf not found ({exc}); build nccl-tests and pass --nccl-tests-bin"
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
    run = run_alltoall_perf(sorted(set(sizes.values())), binary=spec.launch.nccl_tests_bin, gpus=world,
                            timeout_s=spec.launch.job_timeout_s)  # fmt: skip
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
    outcome = JobOutcome(backend=NAME, argv=[run.binary], returncode=0 if ok else 1, signal=None, timed_out=False,
                         duration_s=time.monotonic() - t0, started_at=started)  # fmt: skip
    files.write_job(outcome.to_dict())
    return outcome


def nccl_tests_record(case: CaseSpec, row: Any, res: Any, binary: str, where: dict[str, int]) -> CaseRecord:
    """alltoall_perf's line for the case's size: the row itself, and an `alltoall` op whose figures are
    nccl-tests' own algbw and busbw (out-of-place)."""
    status = "ok" if res.ok else "incorrect" if res.status == "wrong" else "failed"
    t = float(row.time_us_oop)
    size = float(row.size_bytes)
    summary = Summary(n=1, median_us=t, p10_us=t, p90_us=t, p99_us=t, min_us=t, max_us=t, mean_us=t,
                      rank_spread_us=0.0, rel_iqr=0.0)  # fmt: skip
    figures = tuple(
        Figure(definition=name, bytes_mean=size, bytes_max=size, gbps=float(gbps))
        for name, gbps in (("nccl_algbw", row.algbw_gbps_oop), ("nccl_busbw", row.busbw_gbps_oop))
    )
    op = OpResult(op="alltoall", samples_us=((t,),), bytes_per_row=0, summary=summary, figures=figures)
    nccl = NcclTestsRow(
        size_bytes=row.size_bytes, count=row.count, dtype=row.dtype, time_us_oop=t, algbw_gbps_oop=row.algbw_gbps_oop,
        busbw_gbps_oop=row.busbw_gbps_oop, wrong_oop=row.wrong_oop, time_us_ip=row.time_us_ip,
        algbw_gbps_ip=row.algbw_gbps_ip, busbw_gbps_ip=row.busbw_gbps_ip, wrong_ip=row.wrong_ip,
        avg_busbw_gbps=res.avg_busbw_gbps, status=res.status, source=res.source or binary,
        argv=tuple(res.argv or ()),
    )  # fmt: skip
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


class NcclTestsBackend(Backend):
    """A raw-NCCL baseline, not a dispatch/combine: the runner calls run_host_job instead of launching
    moelab's ranks (its own binary launches the GPUs)."""

    name = NAME
    description = (
        "nccl-tests alltoall_perf at each case's dispatch bytes (raw NCCL baseline; --nccl-tests-bin)"
    )
    job_kind = "host"

    @classmethod
    def availability(cls) -> str | None:
        return availability(None)

    @classmethod
    def availability_for(cls, launch: LaunchSpec) -> str | None:
        return availability(launch.nccl_tests_bin)

    @classmethod
    def run_host_job(cls, spec: RunSpec, files: JobFiles) -> JobOutcome:
        return run_nccl_tests_job(spec, files)

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        raise NotImplementedError("nccl-tests runs its own binary; it has no dispatch")

    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        raise NotImplementedError("nccl-tests runs its own binary; it has no combine")
