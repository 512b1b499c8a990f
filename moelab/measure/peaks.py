"""This machine's achievable link figures, measured once at the start of a GPU run, so every backend can be
read as "% of what the hardware really does" beside "% of the datasheet peak".

- `peer_copy_shift{k}`: every rank sends one large buffer to the rank `k` places on and receives one from
  the rank `k` places back, all at once (NCCL point-to-point in one group): bytes per rank and
  direction over the slowest rank's median time. What one GPU can push to one peer (pair by pair).
- `peer_exchange_all`: every rank sends an equal share to each of its peers and receives as much from
  each, all at once: the bytes a rank sends to other ranks over the slowest rank's median time. What one
  GPU moves to all its peers together, its link capacity where traffic goes to several peers (an NVSwitch
  GPU sends more to three peers at once than to one: the pair figure is no bound for an all-to-all).
- `a2a_algbw_gbps` / `a2a_remote_gbps`: one large all_to_all_single with equal splits: every byte a rank
  sends (its own share included) and only the bytes to other ranks, over the slowest rank's median time.
Written by rank 0 of the first ranks job of a run to RUN_DIR/peaks.json (GPU runs and, with smaller
buffers, CPU runs on gloo); ingest stores it as it is.

The same job measures each GPU's achievable rates for the e2e layer's roofline (RUN_DIR/rates.json,
table measured_rates; moelab.measure.e2e.roofline): `dense_bf16_matmul` (a large square bf16 matmul,
FLOPs over time), `dense_bf16_matmul_sustained` (the same matmul back to back for about a second: the rate
under the GPU's power limit, where a layer that runs for long is; results/h200x1-r19: 684 against 790-810
TFLOP/s on one H200) and `hbm_copy` (a large device-to-device copy, bytes read + written over time).
The roofline divides by the burst rate, the larger: a bound must not be beaten.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from moelab.core.peaks import MeasuredPeak, MeasuredRate
from moelab.measure.timing import Clock

PEAK_BYTES = 256 * 1024 * 1024  # per rank and transfer: well past the link's latency, several times L2
CPU_PEAK_BYTES = (
    4 * 1024 * 1024
)  # gloo on CPU ranks: the same exchanges, small enough to cost well under a second
ITERS = 20
MATMUL_N = 8192  # 2 x 8192^3 = 1.1 TFLOP a call: past the launch cost, the shape cuBLAS runs at its best
COPY_BYTES = 1 << 30  # per copy: many times L2, so every byte comes from and goes to HBM
# back-to-back matmuls: about a second on an H200 (1.4-1.6 ms each), longer on slower GPUs
SUSTAIN_CALLS = 640


def _every_rank(clock: Clock, mine: Any) -> list[Any]:
    """`mine` from every rank of the clock's group, in rank order."""
    gathered: list[Any] = [None] * dist.get_world_size(clock.group)  # type: ignore[arg-type]
    dist.all_gather_object(gathered, mine, group=clock.group)  # type: ignore[arg-type]
    return gathered


def _median_slowest(clock: Clock, fn: Callable[[], object]) -> float:
    times = clock.sample(fn, ITERS, 3)
    return float(statistics.median(max(v) for v in zip(*_every_rank(clock, times), strict=True)))


def _exchange(
    clock: Clock, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]
) -> float:
    """The slowest rank's median time of one group of point-to-point sends and receives, all at once."""
    group: Any = clock.group

    def run() -> None:
        ops = [dist.P2POp(dist.isend, t, peer, group=group) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer, group=group) for t, peer in recvs]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    return _median_slowest(clock, run)


def measure_peaks(clock: Clock, rank: int, world: int, nbytes: int = PEAK_BYTES) -> list[MeasuredPeak]:
    """Pair by pair (`peer_copy_shift{k}`), with every peer at once (`peer_exchange_all`) and NCCL's
    all_to_all (`a2a_algbw`, `a2a_remote`); `nbytes` per rank and direction (smaller on CPU, gloo)."""
    dev = clock.device
    elems = nbytes // 2
    src = torch.ones(elems, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    mib = f"{nbytes / 2**20:g} MiB"
    out = []
    for shift in range(1, world):
        to, frm = (rank + shift) % world, (rank - shift) % world
        t = _exchange(clock, [(src, to)], [(dst, frm)])
        out.append(
            MeasuredPeak(
                name=f"peer_copy_shift{shift}",
                gbps=nbytes / (t * 1e-6) / 1e9,
                bytes=nbytes,
                definition=f"pair by pair: every rank sends {mib} to the rank {shift} on and receives as much, concurrently (send/recv in one group): bytes per rank and direction / the slowest rank's median time",
            )
        )
    if world > 1:
        peers = [p for p in range(world) if p != rank]
        share = elems // len(peers)
        sends = [(src[i * share : (i + 1) * share], p) for i, p in enumerate(peers)]
        recvs = [(dst[i * share : (i + 1) * share], p) for i, p in enumerate(peers)]
        t = _exchange(clock, sends, recvs)
        moved = 2 * share * len(peers)
        out.append(
            MeasuredPeak(
                name="peer_exchange_all",
                gbps=moved / (t * 1e-6) / 1e9,
                bytes=moved,
                definition=f"with every peer at once: every rank sends {mib} split evenly over its {world - 1} peers and receives as much, all in one group of send/recv: bytes a rank sends to other ranks (per direction) / the slowest rank's median time; the GPU's link capacity where traffic goes to several peers",
            )
        )
    a2a_elems = elems - elems % world  # equal splits: a whole number of elements per rank
    a2a_in = torch.ones(a2a_elems, dtype=torch.bfloat16, device=dev)
    a2a_out = torch.empty_like(a2a_in)
    t = _median_slowest(clock, lambda: dist.all_to_all_single(a2a_out, a2a_in, group=clock.group))  # type: ignore[arg-type]
    a2a_bytes = 2 * a2a_elems
    remote = a2a_bytes * (world - 1) // world
    out.append(
        MeasuredPeak(
            name="a2a_algbw",
            gbps=a2a_bytes / (t * 1e-6) / 1e9,
            bytes=a2a_bytes,
            definition="all_to_all_single, equal splits: every byte a rank sends (own share included) / the slowest rank's median time",
        )
    )
    out.append(
        MeasuredPeak(
            name="a2a_remote",
            gbps=remote / (t * 1e-6) / 1e9,
            bytes=remote,
            definition="the same all_to_all_single: only the bytes sent to other ranks / the slowest rank's median time",
        )
    )
    return out


def _random(n: int, seed: int, device: torch.device) -> torch.Tensor:
    """Random bf16 data: a matmul of constant or zero inputs runs faster than one of real data (on an H200
    of this workplace a bf16 matmul ran 13% faster on zeros), so a rate timed on it is not achievable."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)


def _matmul_us(clock: Clock) -> tuple[float, float]:
    """The matmul's time as a burst (the slowest rank's median of ITERS calls, each from a flushed L2 and
    aligned ranks) and sustained (_sustained_us), on one set of operands."""
    a = _random(MATMUL_N * MATMUL_N, 1, clock.device).view(MATMUL_N, MATMUL_N)
    b = _random(MATMUL_N * MATMUL_N, 2, clock.device).view(MATMUL_N, MATMUL_N)
    c = torch.empty_like(a)
    burst = _median_slowest(clock, lambda: torch.matmul(a, b, out=c))
    return burst, _sustained_us(clock, a, b, c)


def _sustained_us(clock: Clock, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> float:
    """The slowest rank's median time of a matmul in the second half of SUSTAIN_CALLS queued back to back
    (no flush, no barrier between them: the GPU never idles, so it reaches its power limit and the clock
    it holds there; the first half is the clock coming down)."""
    clock.sync()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(SUSTAIN_CALLS)
    ]
    for start, end in events:
        start.record()
        torch.matmul(a, b, out=c)
        end.record()
    torch.cuda.synchronize(clock.device)
    times = [start.elapsed_time(end) * 1e3 for start, end in events[SUSTAIN_CALLS // 2 :]]
    return float(max(_every_rank(clock, statistics.median(times))))


def _copy_us(clock: Clock) -> float:
    src = _random(COPY_BYTES // 2, 3, clock.device)
    dst = torch.empty_like(src)
    return _median_slowest(clock, lambda: dst.copy_(src))


def measure_device_rates(clock: Clock) -> list[MeasuredRate]:
    """This GPU's dense bf16 matmul rate and HBM copy rate (every rank its own GPU, at the same time; the
    slowest rank's median). Each measurement's buffers are freed before the next."""
    flops, moved = 2.0 * MATMUL_N**3, 2.0 * COPY_BYTES
    (t_mm, t_sustained), t_copy = _matmul_us(clock), _copy_us(clock)
    return [
        MeasuredRate(
            name="dense_bf16_matmul",
            value=flops / (t_mm * 1e-6) / 1e12,
            unit="TFLOP/s",
            work=flops,
            definition=f"torch.matmul of two {MATMUL_N}x{MATMUL_N} bf16 matrices: 2 n^3 FLOPs / the slowest rank's median time",
        ),
        MeasuredRate(
            name="dense_bf16_matmul_sustained",
            value=flops / (t_sustained * 1e-6) / 1e12,
            unit="TFLOP/s",
            work=flops,
            definition=f"the same matmul {SUSTAIN_CALLS} times back to back: 2 n^3 FLOPs / the median time of the "
            "second half's calls, slowest rank (the rate at the GPU's power limit)",
        ),
        MeasuredRate(
            name="hbm_copy",
            value=moved / (t_copy * 1e-6) / 1e9,
            unit="GB/s",
            work=moved,
            definition=f"a {COPY_BYTES >> 20} MiB device-to-device copy: bytes read + bytes written / the slowest rank's median time",
        ),
    ]
