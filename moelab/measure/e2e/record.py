"""The e2e layer's case as a CaseRecord: its ops (layer, compute-only, dispatch/combine inside the layer)
summarised like any op, its metrics (tokens/s, exposed communication, overlap efficiency) kept as metrics."""

from __future__ import annotations

from typing import Any

from moelab.core.case_record import CaseRecord, CheckResult, Metric
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.rows import RankRows
from moelab.core.spec import CaseSpec


def e2e_case_record(case: CaseSpec, d: dict[str, Any], world: int, gpus_per_node: int) -> CaseRecord:
    """`d` as moelab.measure.e2e.bench builds it: status, reason, check, ops {op: samples_us, bytes_per_row},
    metrics [{name, value, unit, definition}], rows, host_sync, backend_record."""
    status = d["status"]
    if status != "ok":
        check = d.get("check")
        return CaseRecord(
            case=case, status=status, reason=str(d.get("reason") or status)[:2000], world=world,
            gpus_per_node=gpus_per_node, backend_record=dict(d.get("backend_record") or {}),
            check=_check(check) if check else None,
        )  # fmt: skip
    rows = tuple(RankRows(**r) for r in d.get("rows") or [])
    ops = tuple(
        op_result(
            OpMeasurement(op=op, samples_us=o["samples_us"], bytes_per_row=int(o.get("bytes_per_row") or 0)),
            rows,
        )
        for op, o in d["ops"].items()
    )
    return CaseRecord(
        case=case, status="ok", world=world, gpus_per_node=gpus_per_node,
        backend_record=dict(d.get("backend_record") or {}), check=_check(d.get("check") or {}), ops=ops, rows=rows,
        metrics=tuple(Metric(name=m["name"], value=m.get("value"), unit=m.get("unit"), definition=m.get("definition"))
                      for m in d.get("metrics") or []),
        host_sync=d.get("host_sync"),
    )  # fmt: skip


def _check(c: dict[str, Any]) -> CheckResult:
    return CheckResult(
        dispatch_err=c.get("dispatch_err"),
        combine_err=c.get("combine_err"),
        messages=tuple(c.get("messages") or ()),
    )
