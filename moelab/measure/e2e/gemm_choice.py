"""Which expert-GEMM implementation a case runs, and which kernels it launched.

`gemm = auto` on a GPU with torch._grouped_mm times the candidates (the grouped CUTLASS kernel and the
padded batched matmul, moelab.measure.e2e.layer) on the case's own received rows before the check, a few
calls each, and keeps the fastest by the slowest rank's time, so every rank runs the same one. At 128+
experts per rank each expert has a few hundred rows, where the grouped kernel's tiles run short (issue
37: 56% of the dense rate at the DeepSeek-V3 shape) and a padded batched matmul may not; at 8 experts per
rank the grouped kernel is near dense. The trial times and the kernels that ran are stored with the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from moelab.measure.e2e.layer import Grouped, MoELayer

CANDIDATES = ("grouped", "padded")
TRIALS = 3
KERNEL_WORDS = ("gemm", "cutlass", "xmma", "sm90", "bmm", "matmul", "nvjet")


@dataclass(frozen=True, slots=True)
class GemmChoice:
    impl: str
    trials_us: dict[str, float] = field(default_factory=dict)  # candidate -> slowest rank's median µs


def _time_us(fn: Callable[[], object], iters: int) -> float:
    fn()  # warm-up: the first call of a shape picks its kernels
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def choose_gemm(layer: MoELayer, grouped: Grouped, group: Any, world: int) -> GemmChoice:
    """The fastest candidate on `grouped` (the case's whole batch), agreed by every rank of `group`."""
    mine: dict[str, float] = {}
    before = layer.gemm
    with torch.no_grad():
        for impl in CANDIDATES:
            layer.gemm = impl
            mine[impl] = _time_us(lambda: layer.ffn(grouped), TRIALS)
    layer.gemm = before
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    slowest = {impl: max(g[impl] for g in gathered) for impl in CANDIDATES}
    return GemmChoice(impl=min(slowest, key=lambda k: slowest[k]), trials_us=slowest)


def gemm_kernels(fn: Callable[[], object]) -> list[str]:
    """The GPU kernels of `fn` whose names say GEMM, by total time (one profiled call); [] off CUDA."""
    if not torch.cuda.is_available():
        return []
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for e in prof.events():
        name = e.name
        if e.device_type == torch.autograd.DeviceType.CUDA and any(w in name.lower() for w in KERNEL_WORDS):
            totals[name] = totals.get(name, 0.0) + float(e.device_time_total)
    return [n[:200] for n, _ in sorted(totals.items(), key=lambda kv: -kv[1])][:4]
