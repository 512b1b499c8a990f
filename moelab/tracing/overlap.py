"""How much communication ran under the expert GEMMs, read from a torch Chrome trace of the e2e layer.

Within each instance of a moelab range (the profiler capture synchronises the device inside the range, so
its kernels finish inside it), GPU kernels are sorted into communication (NCCL, DeepEP, Hybrid-EP, the
all-to-all's own kernels) and GEMMs (CUTLASS, cuBLAS, grouped GEMM kernels) by name; each class's busy
time is the union of its kernels' intervals, and the overlap the intersection of the two unions. The
fraction `overlap / comm` is the share of communication time hidden under GEMMs: near zero for the serial
layer, what the two-batch overlap is meant to raise. Classification is by kernel name and can miss a
kernel with an unusual name: the tables show the per-class totals so a miss is visible.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab.tracing.nvtx_ranges import PREFIX, parse_range_name
from moelab.tracing.torch_trace import load_chrome_trace

COMM_KERNELS = re.compile(
    r"nccl|deep_ep|hybrid_ep|intranode|internode|notify_dispatch|alltoall|all_to_all", re.I
)
GEMM_KERNELS = re.compile(r"gemm|cutlass|xmma|cublas|grouped_mm|wgmma", re.I)

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two unions (each sorted and disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class RangeOverlap:
    """Per range name, summed over its instances (µs)."""

    range_name: str
    op: str
    instances: int
    span_us: float
    comm_us: float
    gemm_us: float
    overlap_us: float

    @property
    def hidden_fraction(self) -> float | None:
        return self.overlap_us / self.comm_us if self.comm_us > 0 else None


def kernel_overlap(path: Path, prefix: str = PREFIX) -> list[RangeOverlap]:
    data = load_chrome_trace(path)
    events: list[dict[str, Any]] = [
        e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
    ]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ranges = [
        e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(prefix)
    ]
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for r in ranges:
        start = float(r["ts"])
        end = start + float(r.get("dur", 0.0))
        comm: list[Interval] = []
        gemm: list[Interval] = []
        for k in kernels:
            ks = float(k["ts"])
            ke = ks + float(k.get("dur", 0.0))
            s, e = max(ks, start), min(ke, end)
            if s >= e:
                continue
            name = str(k.get("name", ""))
            if COMM_KERNELS.search(name):
                comm.append((s, e))
            elif GEMM_KERNELS.search(name):
                gemm.append((s, e))
        cu, gu = union(comm), union(gemm)
        a = acc[str(r["name"])]
        a[0] += 1
        a[1] += end - start
        a[2] += length(cu)
        a[3] += length(gu)
        a[4] += length(intersection(cu, gu))
    out = []
    for name, (n, span, c, g, o) in sorted(acc.items()):
        parsed = parse_range_name(name)
        out.append(
            RangeOverlap(
                range_name=name,
                op=parsed[1] if parsed else name,
                instances=int(n),
                span_us=span,
                comm_us=c,
                gemm_us=g,
                overlap_us=o,
            )
        )
    return out
