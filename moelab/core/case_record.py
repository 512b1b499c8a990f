"""The case record: what one measured case leaves in RUN_DIR/BACKEND/results.jsonl, one JSON line each.

Every producer (the dispatch/combine worker, the e2e layer, the nccl-tests job, the tests' synthetic runs)
builds this type, and ingest reads it back by field name, so a new field is one edit here that mypy checks
at every writer. Everything judged or derived (summaries, bandwidths, library figures, suspect marks) is
in the record before ingest: the store only stores.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

from moelab.core.rows import RankRows
from moelab.core.spec import CaseSpec

RECORD_VERSION = 2

Status = Literal["ok", "skipped", "unsupported", "incorrect", "failed"]
STATUSES: tuple[str, ...] = ("ok", "skipped", "unsupported", "incorrect", "failed")

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """Per-iteration times (the slowest rank's) summarised; see moelab.core.stats.summarize."""

    n: int
    median_us: float
    p10_us: float
    p90_us: float
    p99_us: float
    min_us: float
    max_us: float
    mean_us: float
    rank_spread_us: float
    rel_iqr: float
    noise: float | None = None  # relative half-width of the median's confidence interval
    # over the starts of the job (--repeat, moelab.core.repeats): how many measured it, the bootstrap interval
    # of the median of their medians (median_us then is that median), and the CV between their medians
    repeats: int = 1
    ci_low_us: float | None = None
    ci_high_us: float | None = None
    process_cv: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    """One bandwidth of one op under a named definition (table `definitions` holds the text)."""

    definition: str
    bytes_mean: float
    bytes_max: float
    gbps: float
    text: str | None = None  # the definition's text where it is not in moelab.core.bandwidth.DEFINITIONS


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelShare:
    name: str
    count: int
    total_us: float
    share: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RankKernelTime:
    """Kernel-only time of an op on one rank, from a profiler trace."""

    kernel_us: float | None
    kernels: tuple[KernelShare, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class OpResult:
    op: str
    samples_us: tuple[tuple[float, ...], ...]  # [rank][iteration]
    bytes_per_row: int
    summary: Summary
    figures: tuple[Figure, ...] = ()
    host_sync: str | None = None  # the host synchronisation this op contains, None when it has none
    kernel: tuple[RankKernelTime | None, ...] | None = None  # per rank, when traced
    kernel_us: float | None = None  # slowest rank's kernel-only time
    stability: str | None = None  # None when stable, else why the median is not to be trusted
    library_samples_us: tuple[tuple[float, ...], ...] | None = None  # [rank][call], timed the library's way


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    dispatch_err: float | None
    combine_err: float | None
    messages: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceFile:
    rank: int | None
    kind: str
    path: str
    size_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class IbPort:
    device: str
    port: int
    status: str
    xmit_bytes: float | None
    rcv_bytes: float | None
    xmit_gbps: float | None
    rcv_gbps: float | None
    rate_gbps: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class IbNode:
    node: int
    host: str
    elapsed_s: float | None
    ports: tuple[IbPort, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Metric:
    name: str
    value: float | None
    unit: str | None
    definition: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclTestsRow:
    """One size line of nccl-tests' alltoall_perf, with the job's verdict."""

    size_bytes: int
    count: int
    dtype: str
    time_us_oop: float
    algbw_gbps_oop: float
    busbw_gbps_oop: float
    wrong_oop: int | None
    time_us_ip: float | None
    algbw_gbps_ip: float | None
    busbw_gbps_ip: float | None
    wrong_ip: int | None
    avg_busbw_gbps: float | None
    status: str
    source: str | None
    argv: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseRecord:
    case: CaseSpec
    status: Status
    reason: str | None = None
    world: int
    gpus_per_node: int
    backend_record: dict[str, Any] = field(default_factory=dict)
    check: CheckResult | None = None
    ops: tuple[OpResult, ...] = ()
    rows: tuple[RankRows, ...] = ()
    traces: tuple[TraceFile, ...] = ()
    ib: tuple[IbNode, ...] | None = None
    metrics: tuple[Metric, ...] = ()
    nccl_tests: NcclTestsRow | None = None
    host_sync: str | None = None  # the case's host synchronisations in words (every op's)
    nvtx_counts: dict[str, int] = field(default_factory=dict)
    suspect_reason: str | None = None
    version: int = RECORD_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"case status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.status == "ok" and not (self.ops or self.nccl_tests):
            raise ValueError(f"case {self.case.case_id}: status ok with nothing measured")

    @property
    def case_id(self) -> str:
        return self.case.case_id

    @property
    def backend(self) -> str:
        return self.case.backend

    def op(self, name: str) -> OpResult | None:
        return next((o for o in self.ops if o.op == name), None)

    @classmethod
    def not_measured(
        cls, case: CaseSpec, status: Status, reason: str, *, world: int, gpus_per_node: int
    ) -> CaseRecord:
        """A case that ran nothing: skipped (invalid combination), unsupported, or failed (its job died)."""
        assert status in ("skipped", "unsupported", "failed", "incorrect")
        return cls(case=case, status=status, reason=reason[:2000], world=world, gpus_per_node=gpus_per_node)

    @classmethod
    def skipped(cls, case: CaseSpec, reason: str, *, world: int, gpus_per_node: int) -> CaseRecord:
        return cls.not_measured(case, "skipped", reason, world=world, gpus_per_node=gpus_per_node)

    @classmethod
    def unsupported(cls, case: CaseSpec, reason: str, *, world: int, gpus_per_node: int) -> CaseRecord:
        return cls.not_measured(case, "unsupported", reason, world=world, gpus_per_node=gpus_per_node)

    @classmethod
    def failed(cls, case: CaseSpec, reason: str, *, world: int, gpus_per_node: int) -> CaseRecord:
        return cls.not_measured(case, "failed", reason, world=world, gpus_per_node=gpus_per_node)

    def to_json(self) -> str:
        return json.dumps(_plain(self), allow_nan=True)

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseRecord:
        if d.get("version") != RECORD_VERSION:
            raise ValueError(f"case record version {d.get('version')} is not {RECORD_VERSION}")
        return cls(
            case=CaseSpec.from_dict(d["case"]),
            status=d["status"],
            reason=d.get("reason"),
            world=d["world"],
            gpus_per_node=d["gpus_per_node"],
            backend_record=dict(d.get("backend_record") or {}),
            check=_build(CheckResult, d["check"]) if d.get("check") else None,
            ops=tuple(_op_from(o) for o in d.get("ops") or ()),
            rows=tuple(_build(RankRows, r) for r in d.get("rows") or ()),
            traces=tuple(_build(TraceFile, t) for t in d.get("traces") or ()),
            ib=None if d.get("ib") is None else tuple(_ib_from(n) for n in d["ib"]),
            metrics=tuple(_build(Metric, m) for m in d.get("metrics") or ()),
            nccl_tests=_build(NcclTestsRow, d["nccl_tests"]) if d.get("nccl_tests") else None,
            host_sync=d.get("host_sync"),
            nvtx_counts=dict(d.get("nvtx_counts") or {}),
            suspect_reason=d.get("suspect_reason"),
        )

    @classmethod
    def from_json(cls, line: str) -> CaseRecord:
        return cls.from_dict(json.loads(line))


def _plain(obj: Any) -> Any:
    if isinstance(obj, CaseSpec):
        return obj.to_dict()
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple | list):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN; a missing figure is null
    return obj


def _build(cls: type[T], d: dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
    return cls(**kwargs)


def _op_from(d: dict[str, Any]) -> OpResult:
    kernel = d.get("kernel")
    return OpResult(
        op=d["op"],
        samples_us=tuple(tuple(float(t) for t in r) for r in d["samples_us"]),
        bytes_per_row=d["bytes_per_row"],
        summary=_build(Summary, d["summary"]),
        figures=tuple(_build(Figure, f) for f in d.get("figures") or ()),
        host_sync=d.get("host_sync"),
        kernel=None
        if kernel is None
        else tuple(
            None
            if k is None
            else RankKernelTime(
                kernel_us=k.get("kernel_us"),
                kernels=tuple(_build(KernelShare, s) for s in k.get("kernels") or ()),
            )
            for k in kernel
        ),
        kernel_us=d.get("kernel_us"),
        stability=d.get("stability"),
        library_samples_us=None
        if d.get("library_samples_us") is None
        else tuple(tuple(float(t) for t in r) for r in d["library_samples_us"]),
    )


def _ib_from(d: dict[str, Any]) -> IbNode:
    return IbNode(
        node=d["node"],
        host=d["host"],
        elapsed_s=d.get("elapsed_s"),
        ports=tuple(_build(IbPort, p) for p in d.get("ports") or ()),
    )
