"""`--backend nccl-tests`: the user's alltoall_perf at the sizes of the run's cases, as a raw-NCCL baseline
stored beside the EP backends (not a dispatch/combine: no routing, no correctness check of ours)."""

from __future__ import annotations

import time
from typing import Any

from moelab.accounting.bandwidth import count_rows
from moelab.backends.nccl_tests import aligned_size, find_alltoall_perf, run_alltoall_perf
from moelab.launch.local import JobOutcome
from moelab.launch.rundir import JobFiles, now_iso
from moelab.plan.routing import route_all
from moelab.plan.spec import CaseSpec, RunSpec

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
    for case in spec.cases_for(NAME):
        record: dict[str, Any] = {
            "case_id": case.case_id,
            "backend": NAME,
            "case": case.to_dict(),
            "world": world,
        }
        if case.skip_reason:
            files.append_result(record | {"status": "skipped", "reason": case.skip_reason})
            continue
        hit = by_size.get(sizes[case.case_id])
        if hit is None:
            ok = False
            problems = "; ".join(p for r in run.results for p in r.problems) or "no row for this size"
            files.append_result(record | {"status": "failed", "reason": f"alltoall_perf: {problems}"[:2000]})
            continue
        res, row = hit
        status = "ok" if res.ok else "incorrect" if res.status == "wrong" else "failed"
        ok = ok and res.ok
        files.append_result(record | {"status": status, "reason": None if res.ok else res.status,
                                      "nccl_tests": {"row": _row(row), "result": res.to_dict() | {"rows": None}, "binary": run.binary}})  # fmt: skip
    outcome = JobOutcome(backend=NAME, argv=[run.binary], returncode=0 if ok else 1, signal=None, timed_out=False,
                         duration_s=time.monotonic() - t0, started_at=started)  # fmt: skip
    files.write_job(outcome.to_dict())
    return outcome


def _row(row: Any) -> dict[str, Any]:
    return {k: getattr(row, k) for k in row.__slots__}
