"""What a trace says about each named range: its API time, its kernel-only time and its kernels' shares.

One result type for every trace format (torch.profiler Chrome JSON, nsys SQLite), built from range
instances, each holding the events attributed to it.

- api time: the range's own span on the thread that opened it (CPU side), summed over instances;
- kernel-only time: per instance the union of its kernels' GPU intervals (time the GPU ran at least
  one of the range's kernels; overlapping kernels on two streams count once), summed over instances;
  `kernel_sum_us_total` is the plain sum of kernel durations, larger than the union where kernels overlap;
- shares: each kernel name's summed duration over the sum of all the range's kernel durations.
Without GPU kernels (a CPU run) the attributed events are CPU ops, kernel-only time is None (unknown,
not zero), and the shares are of CPU-op time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

EVENT_KINDS = ("kernel", "cpu_op")


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelShare:
    name: str
    count: int
    total_us: float
    share: float  # of the range's summed event time, 0..1


@dataclass(frozen=True, kw_only=True, slots=True)
class RangeSummary:
    name: str
    count: int  # instances of the range in the trace
    api_us_total: float
    kernel_us_total: float | None  # union of kernel intervals per instance, summed; None without kernels
    kernel_sum_us_total: float | None
    event_kind: str  # "kernel" or "cpu_op": what `kernels` lists
    kernels: tuple[KernelShare, ...]

    @property
    def api_us_mean(self) -> float:
        return self.api_us_total / self.count if self.count else float("nan")

    @property
    def kernel_us_mean(self) -> float | None:
        if self.kernel_us_total is None or not self.count:
            return None
        return self.kernel_us_total / self.count


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceSummary:
    source: str  # the trace file
    format: str  # "chrome" or "nsys-sqlite"
    attribution: str  # how events were tied to ranges (see the reader's docstring)
    rank: int | None
    world_size: int | None
    ranges: tuple[RangeSummary, ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> RangeSummary | None:
        return next((r for r in self.ranges if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Event:
    name: str
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return max(0.0, self.end_us - self.start_us)


@dataclass(slots=True)
class RangeInstance:
    name: str
    start_us: float
    end_us: float
    events: list[Event] = field(default_factory=list)


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def summarize_instances(instances: Sequence[RangeInstance], event_kind: str) -> tuple[RangeSummary, ...]:
    """One RangeSummary per range name, in order of first appearance."""
    if event_kind not in EVENT_KINDS:
        raise ValueError(f"event_kind must be one of {EVENT_KINDS}, got {event_kind!r}")
    by_name: dict[str, list[RangeInstance]] = {}
    for inst in sorted(instances, key=lambda i: i.start_us):
        by_name.setdefault(inst.name, []).append(inst)
    out = []
    for name, insts in by_name.items():
        per_kernel: dict[str, list[float]] = {}
        union_total = 0.0
        for inst in insts:
            union_total += union_us((e.start_us, e.end_us) for e in inst.events)
            for e in inst.events:
                per_kernel.setdefault(e.name, []).append(e.dur_us)
        event_total = sum(sum(v) for v in per_kernel.values())
        shares = tuple(
            sorted(
                (
                    KernelShare(
                        name=k,
                        count=len(v),
                        total_us=sum(v),
                        share=(sum(v) / event_total) if event_total > 0 else 0.0,
                    )
                    for k, v in per_kernel.items()
                ),
                key=lambda s: (-s.total_us, s.name),
            )
        )
        is_kernel = event_kind == "kernel"
        out.append(
            RangeSummary(
                name=name,
                count=len(insts),
                api_us_total=sum(max(0.0, i.end_us - i.start_us) for i in insts),
                kernel_us_total=union_total if is_kernel else None,
                kernel_sum_us_total=event_total if is_kernel else None,
                event_kind=event_kind,
                kernels=shares,
            )
        )
    return tuple(out)
