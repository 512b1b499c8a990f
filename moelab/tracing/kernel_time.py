"""Kernel-only time per op call, from a trace summary, to store beside the event-timed (API) figure.

kernel_us per call = kernel-only time of the op's range (union of its kernels per instance, summed over
instances) / op calls recorded under the range. The calls come from the capture (TraceCapture.calls, or
the trace's own `moelab.calls` metadata), or from an NVTX Counter; when none is given the number of
range instances is used (one call per instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moelab.tracing.nvtx_ranges import OPS, range_name
from moelab.tracing.summary import KernelShare, TraceSummary


@dataclass(frozen=True, kw_only=True, slots=True)
class OpKernelTime:
    backend: str
    op: str
    case_id: str
    range_name: str
    calls: int
    api_us: float  # per call: the range's CPU span (on GPU it ends after a device synchronize)
    kernel_us: float | None  # per call; None where the trace holds no GPU kernels (CPU runs)
    kernel_sum_us: float | None  # per call, kernels summed without merging overlaps
    event_kind: str
    kernels: tuple[KernelShare, ...]

    def to_record(self) -> dict[str, Any]:
        """The JSON the worker stores under record["ops"][op]["trace"] (per rank)."""
        return {
            "range": self.range_name,
            "calls": self.calls,
            "api_us": self.api_us,
            "kernel_us": self.kernel_us,
            "kernel_sum_us": self.kernel_sum_us,
            "event_kind": self.event_kind,
            "kernels": [
                {"name": k.name, "count": k.count, "total_us": k.total_us, "share": k.share}
                for k in self.kernels
            ],
        }


def op_kernel_times(
    summary: TraceSummary,
    backend: str,
    case_id: str,
    calls: Mapping[str, int] | None = None,
    ops: tuple[str, ...] = OPS,
) -> dict[str, OpKernelTime]:
    """Per op found in the trace, its per-call API and kernel-only time and its kernels' shares."""
    if calls is None:
        meta_calls = summary.metadata.get("calls")
        calls = meta_calls if isinstance(meta_calls, dict) else {}
    out: dict[str, OpKernelTime] = {}
    for op in ops:
        name = range_name(backend, op, case_id)
        r = summary.get(name)
        if r is None or r.count == 0:
            continue
        n = int(calls.get(name, r.count))
        if n <= 0:
            raise ValueError(f"call count for {name} must be positive, got {n}")
        out[op] = OpKernelTime(
            backend=backend,
            op=op,
            case_id=case_id,
            range_name=name,
            calls=n,
            api_us=r.api_us_total / n,
            kernel_us=None if r.kernel_us_total is None else r.kernel_us_total / n,
            kernel_sum_us=None if r.kernel_sum_us_total is None else r.kernel_sum_us_total / n,
            event_kind=r.event_kind,
            kernels=r.kernels,
        )
    return out


def kernel_bandwidth_gbs(bytes_per_call: float, kernel_us: float | None) -> float | None:
    """Bandwidth with kernel-only time (GB/s = bytes / us / 1e3); None where kernel time is unknown."""
    if kernel_us is None or kernel_us <= 0:
        return None
    return bytes_per_call / kernel_us / 1e3
