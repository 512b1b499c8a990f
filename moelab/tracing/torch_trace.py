"""torch.profiler capture of a few iterations per op, and the summary of a Chrome trace per range.

Capture: after the timed iterations, each op runs `iters` more times under
`record_function("moelab/<backend>/<op>/<case>")` inside one torch.profiler session (CPU activities,
plus CUDA on GPU), and the session is exported as one Chrome-trace JSON per rank. Ranks pass a barrier
before each iteration (outside the range); on GPU the range ends with a device synchronize, so its CPU
span covers the op until its kernels finish (the "API" time of the trace). Each iteration is one
profiler step (`prof.step()`), so the trace holds `ProfilerStep#N` events that HTA's per-iteration views
(temporal breakdown, idle time, CUDA kernel launch statistics) split by.

Holistic Trace Analysis reads a directory of traces and needs each file's top-level
`distributedInfo.rank` (unique per file; hta/common/trace_file.py raises without it). torch writes
`distributedInfo` (backend, rank, world_size, pg config) itself when a process group is initialized at
profiler start (torch/profiler/profiler.py `_get_distributed_info`); without one we add
`{"rank", "world_size"}` through `add_metadata_json`. So keep one directory per case:
RUN_DIR/<backend>/traces/<case>/rank<R>.json (JobFiles.torch_trace).

Summary (kernel attribution by correlation id): a kernel belongs to a range when the CUDA runtime or
driver call that launched it (`cat` "cuda_runtime"/"cuda_driver", `args.correlation`) ran on the range's
thread inside the range's CPU span; the kernel event (`cat` "kernel") carries the same
`args.correlation`. This holds for kernels that run long after the launch, and for NCCL kernels on their
own stream. Kernels launched from other threads (none of the built-in backends do) are not attributed.
On CPU there are no kernels: the range's events are the top-level CPU ops (`cpu_op`, `user_annotation`)
inside its span, on its own thread and on the process's other threads (gloo runs the transfer on a
worker thread as `gloo:all_to_all`), so the a2a region still shows its events.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab.core.errors import MoelabError
from moelab.tracing.nvtx_ranges import PREFIX, range_name
from moelab.tracing.summary import Event, RangeInstance, TraceSummary, summarize_instances

EPS_US = 1e-3  # timestamps are microseconds with ns decimals: tolerate rounding at range edges
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "user_annotation")


@dataclass(frozen=True, kw_only=True, slots=True)
class TracedOp:
    """One op to profile: `fn` runs it once; `calls` is how many op calls one `fn()` makes."""

    op: str
    fn: Callable[[], object]
    calls: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceCapture:
    path: Path
    size_bytes: int
    rank: int
    world_size: int
    calls: dict[str, int]  # range name -> op calls recorded under it (instances × calls per instance)


def _sync(device: Any, group: Any) -> None:
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _always_record(step: int) -> Any:
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def capture_torch_trace(
    ops: Sequence[TracedOp],
    *,
    backend: str,
    case_id: str,
    iters: int,
    path: Path,
    rank: int,
    world_size: int,
    device: Any,
    group: Any = None,
) -> TraceCapture:
    """Run each op `iters` times under its record_function range in one profiler session; export JSON."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    if iters < 1:
        raise ValueError("iters must be at least 1")
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    calls: dict[str, int] = {}
    _sync(device, group)
    # a schedule that always records: torch only marks ProfilerStep#N (what HTA splits iterations by) when
    # it is given a schedule, and each `prof.step()` below ends one profiled iteration
    with profile(
        activities=activities, record_shapes=False, with_stack=False, schedule=_always_record
    ) as prof:
        if not (dist.is_available() and dist.is_initialized()):
            prof.add_metadata_json("distributedInfo", json.dumps({"rank": rank, "world_size": world_size}))
        for op in ops:
            name = range_name(backend, op.op, case_id)
            for _ in range(iters):
                _sync(device, group)
                with record_function(name):
                    op.fn()
                    if cuda:
                        torch.cuda.synchronize(device)
                prof.step()
            calls[name] = calls.get(name, 0) + iters * op.calls
        prof.add_metadata_json("moelab", json.dumps({"backend": backend, "case_id": case_id, "calls": calls}))
        _sync(device, group)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return TraceCapture(
        path=path, size_bytes=path.stat().st_size, rank=rank, world_size=world_size, calls=calls
    )


def load_chrome_trace(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt") as fh:
                data = json.load(fh)
        else:
            with path.open() as fh:
                data = json.load(fh)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MoelabError(f"cannot read Chrome trace {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise MoelabError(f"{path} is not a Chrome trace (no traceEvents list)")
    return data


def _span(e: dict[str, Any]) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def _top_level(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events not nested in an earlier kept event of the same thread."""
    kept: list[dict[str, Any]] = []
    by_tid: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        by_tid.setdefault(e.get("tid"), []).append(e)
    for evs in by_tid.values():
        end = float("-inf")
        for e in sorted(evs, key=lambda x: (float(x["ts"]), -float(x.get("dur", 0.0)))):
            s, t = _span(e)
            if s >= end - EPS_US:
                kept.append(e)
                end = t
    return kept


def summarize_chrome_trace(path: Path, prefix: str = PREFIX) -> TraceSummary:
    """Per range whose name starts with `prefix` ("" for every user range): API time, kernel-only time,
    kernel shares (CPU ops instead on a CPU trace). Attribution: see the module docstring."""
    data = load_chrome_trace(path)
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    ranges = [
        e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(prefix)
    ]
    kernels_by_corr: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "kernel":
            kernels_by_corr.setdefault((e.get("args") or {}).get("correlation"), []).append(e)
    has_kernels = bool(kernels_by_corr)
    if has_kernels:
        instances = _kernel_ranges(events, ranges, kernels_by_corr)
    else:
        instances = _cpu_ranges(events, ranges)

    raw_dist, raw_meta = data.get("distributedInfo"), data.get("moelab")
    dist_info: dict[str, Any] = raw_dist if isinstance(raw_dist, dict) else {}
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    return TraceSummary(
        source=str(path),
        format="chrome",
        attribution="correlation" if has_kernels else "cpu-nesting",
        rank=dist_info.get("rank"),
        world_size=dist_info.get("world_size"),
        ranges=summarize_instances(instances, "kernel" if has_kernels else "cpu_op"),
        metadata=dict(meta),
    )


def _kernel_ranges(
    events: list[dict[str, Any]],
    ranges: list[dict[str, Any]],
    kernels_by_corr: dict[Any, list[dict[str, Any]]],
) -> list[RangeInstance]:
    """Each range with the kernels launched inside it from its own thread (by correlation id)."""
    launches: dict[tuple[Any, Any], list[tuple[float, Any]]] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in LAUNCH_CATS and corr is not None:
            launches.setdefault((e.get("pid"), e.get("tid")), []).append((float(e["ts"]), corr))
    for v in launches.values():
        v.sort(key=lambda x: x[0])
    instances = []
    for r in ranges:
        start, end = _span(r)
        inst = RangeInstance(name=r["name"], start_us=start, end_us=end)
        calls = launches.get((r.get("pid"), r.get("tid")), [])
        lo = bisect.bisect_left(calls, start - EPS_US, key=lambda x: x[0])
        hi = bisect.bisect_right(calls, end + EPS_US, key=lambda x: x[0])
        for _, corr in calls[lo:hi]:
            for k in kernels_by_corr.get(corr, []):
                ks, ke = _span(k)
                inst.events.append(Event(name=str(k.get("name")), start_us=ks, end_us=ke))
        instances.append(inst)
    return instances


def _cpu_ranges(events: list[dict[str, Any]], ranges: list[dict[str, Any]]) -> list[RangeInstance]:
    """A CPU trace: each range with the top-level CPU ops of its process that lie inside it."""
    range_names = {e["name"] for e in ranges}
    cpu = [e for e in events if e.get("cat") in CPU_CATS and e.get("name") not in range_names]
    instances = []
    for r in ranges:
        start, end = _span(r)
        inside = [
            e
            for e in cpu
            if e.get("pid") == r.get("pid") and _span(e)[0] >= start - EPS_US and _span(e)[1] <= end + EPS_US
        ]
        inst = RangeInstance(name=r["name"], start_us=start, end_us=end)
        for e in _top_level(inside):
            s, t = _span(e)
            inst.events.append(Event(name=str(e.get("name")), start_us=s, end_us=t))
        instances.append(inst)
    return instances
