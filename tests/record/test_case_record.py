"""The typed case record: JSON round trips, constructors, and the contract that the tests' synthetic runs
write exactly what the worker writes (the same type, read back by the same code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.case_record import RECORD_VERSION, CaseRecord, CheckResult
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.rows import RankRows
from moelab.core.spec import CaseSpec
from moelab.core.workload import Workload
from moelab.job.rundir import RunDir

CASE = CaseSpec(
    case_id="c",
    backend="nccl-a2a",
    workload=Workload(hidden=128, tokens_per_rank=8, topk=2, experts_per_rank=2),
)
ROWS = tuple(RankRows(rank=r, recv_rows=8, recv_rows_remote=4, send_rows=8, send_rows_remote=4, rdma_pairs=8,
                      rdma_pairs_remote=0) for r in range(2))  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(min_value=0.1, max_value=1e6), min_size=3, max_size=3), min_size=2, max_size=2
    )
)
def test_round_trip(samples: list[list[float]]) -> None:
    op = op_result(OpMeasurement(op="dispatch", samples_us=samples, bytes_per_row=256, noise=0.01), ROWS)
    rec = CaseRecord(case=CASE, status="ok", world=2, gpus_per_node=2, ops=(op,), rows=ROWS,
                     check=CheckResult(dispatch_err=0.0, combine_err=None))  # fmt: skip
    again = CaseRecord.from_json(rec.to_json())
    assert again == rec


def test_constructors_and_refusals() -> None:
    rec = CaseRecord.unsupported(CASE, "no SM control", world=2, gpus_per_node=2)
    assert (rec.status, rec.reason, rec.ops) == ("unsupported", "no SM control", ())
    with pytest.raises(ValueError, match="nothing measured"):
        CaseRecord(case=CASE, status="ok", world=2, gpus_per_node=2)
    with pytest.raises(ValueError, match="not one of"):
        CaseRecord(case=CASE, status="great", world=2, gpus_per_node=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version"):
        CaseRecord.from_dict(json.loads(rec.to_json()) | {"version": 1})
    assert json.loads(rec.to_json())["version"] == RECORD_VERSION


def test_synthetic_runs_write_what_the_worker_writes(tmp_path: Path) -> None:
    """tests/synthetic_runs builds CaseRecords with the worker's own builder (record.build.op_result); read
    back through the same JobFiles.scan_results ingest uses, every line is a CaseRecord with every ok op
    summarised and figured as a worker's op is."""
    from tests.synthetic_runs import BackendModel, RunModel, write_run

    run_dir = write_run(tmp_path, RunModel(run_id="s", created_at="2026-11-22T07:00:00+00:00",
                                           backends=(BackendModel(name="nccl-a2a", peak_gbps=300),)))  # fmt: skip
    records = RunDir(run_dir).job("nccl-a2a").scan_results().records
    assert records and all(type(r) is CaseRecord for r in records)
    ok = [r for r in records if r.status == "ok"]
    assert ok and all(o.summary.n > 0 and {f.definition for f in o.figures} >= {"nvl_recv", "nvl_remote"}
                      for r in ok for o in r.ops)  # fmt: skip
