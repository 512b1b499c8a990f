"""Which expert-GEMM implementation a case runs, and which kernels it launched.

`gemm = auto` on a GPU with torch._grouped_mm times the candidates (the grouped CUTLASS kernel, the same
with its wide tile forced, moelab's Triton grouped GEMM where it can run
(moelab.measure.e2e.grouped_gemm), and the padded batched matmul; moelab.measure.e2e.layer) on the whole batch,
and apart on the parts of an overlapped schedule (each micro-batch or expert group, summed: the layer's
`part_gemm`), a few calls each, and keeps the fastest by the slowest rank's time, so every rank runs the
same one. At 128+ experts per rank each expert has a few hundred rows, where the grouped kernel's tiles
run short (issue 37: 56% of the dense rate at the DeepSeek-V3 shape) and a padded batched matmul may not;
a micro-batch of that shape at EP = 2 averages 128 rows per expert, where torch drops to its narrow tile
unless padded (`grouped-wide`); at 8 experts per rank the grouped kernel is near dense. The trial times,
the kernels that ran and their tiles are stored with the case.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from moelab.core.e2e_spec import GEMM_TILES
from moelab.measure.e2e.grouped_gemm import unavailable_reason
from moelab.measure.e2e.layer import Grouped, MoELayer, wide_tile_pad

CANDIDATES = ("grouped", "grouped-wide", "triton", "padded")
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


def candidates(batches: Sequence[Grouped], experts: int, triton: bool = False) -> tuple[str, ...]:
    """The implementations worth timing on `batches`: grouped-wide only where some batch averages few enough
    rows per expert for torch's narrow tile (elsewhere it is the grouped kernel itself); triton where
    moelab's Triton grouped GEMM can run (`triton`)."""
    wide = any(wide_tile_pad(g.num_pairs, experts) for g in batches)
    return tuple(c for c in CANDIDATES if (c != "grouped-wide" or wide) and (c != "triton" or triton))


def triton_runs(layer: MoELayer) -> bool:
    """moelab's Triton grouped GEMM can run the layer's GEMMs (moelab.measure.e2e.grouped_gemm)."""
    w = layer.weights
    return unavailable_reason(w.w13.device, int(w.w13.shape[1]), w.intermediate) is None


def choose_gemm(layer: MoELayer, batches: Sequence[Grouped], group: Any, world: int) -> GemmChoice:
    """The fastest candidate over `batches` (the whole batch, or an overlapped schedule's parts: their times
    summed), agreed by every rank of `group`."""
    mine: dict[str, float] = {}
    before = layer.gemm
    with torch.no_grad():
        for impl in candidates(batches, layer.experts_per_rank, triton_runs(layer)):
            layer.gemm = impl
            mine[impl] = sum(_time_us(functools.partial(layer.ffn, g), TRIALS) for g in batches)
    layer.gemm = before
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    slowest = slowest_rank(gathered)
    return GemmChoice(impl=min(slowest, key=lambda k: slowest[k]), trials_us=slowest)


def slowest_rank(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per candidate, the slowest rank's time. A rank whose batches never take torch's narrow tile did not
    time grouped-wide: there it runs the grouped kernel itself, so its grouped time stands in; a candidate
    a rank did not time otherwise counts as never the fastest."""
    names = [c for c in CANDIDATES if any(c in r for r in per_rank)]
    out = {}
    for impl in names:
        times = []
        for r in per_rank:
            stand_in = r.get("grouped") if impl == "grouped-wide" else None
            times.append(r.get(impl, stand_in if stand_in is not None else float("inf")))
        out[impl] = max(times)
    return out


def gemm_tile(kernel: str) -> str:
    """The tile of a torch._grouped_mm CUTLASS kernel, read off its (mangled) name; "" for another."""
    return next((tile for word, tile in GEMM_TILES.items() if word in kernel), "")


def gemm_kernels(fn: Callable[[], object]) -> list[str]:
    """The GPU kernels of `fn` whose names say GEMM, by total time (one profiled call), each led by its
    tile where the name tells it ("64x128x128 ping-pong: ..."); [] off CUDA."""
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
    ranked = [n for n, _ in sorted(totals.items(), key=lambda kv: -kv[1])][:4]
    return [(f"{gemm_tile(n)}: " if gemm_tile(n) else "") + n[:200] for n in ranked]
