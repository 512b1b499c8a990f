"""This machine's achievable link figures, measured once at the start of a GPU run, so every backend can be
read as "% of what the hardware really does" beside "% of the datasheet peak".

- `peer_copy_gbps`: every rank sends one large buffer to the rank `shift` places on and receives one from
  the rank `shift` places back, all at once (NCCL point-to-point in one group): bytes per rank and
  direction over the slowest rank's median time. What one GPU can push to another through its link.
- `a2a_algbw_gbps` / `a2a_remote_gbps`: one large all_to_all_single with equal splits: every byte a rank
  sends (its own share included) and only the bytes to other ranks, over the slowest rank's median time.
Written by rank 0 of the first ranks job of a run to RUN_DIR/peaks.json; ingest stores it as it is.

The same job measures each GPU's achievable rates for the e2e layer's roofline (RUN_DIR/rates.json,
table measured_rates; moelab.measure.e2e.roofline): `dense_bf16_matmul` (a large square bf16 matmul,
FLOPs over time) and `hbm_copy` (a large device-to-device copy, bytes read + written over time).
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
ITERS = 20
MATMUL_N = 8192  # 2 x 8192^3 = 1.1 TFLOP a call: past the launch cost, the shape cuBLAS runs at its best
COPY_BYTES = 1 << 30  # per copy: many times L2, so every byte comes from and goes to HBM


def _median_slowest(clock: Clock, fn: Callable[[], object]) -> float:
    times = clock.sample(fn, ITERS, 3)
    gathered: list[Any] = [None] * dist.get_world_size(clock.group)  # type: ignore[arg-type]
    dist.all_gather_object(gathered, times, group=clock.group)  # type: ignore[arg-type]
    return float(statistics.median(max(v) for v in zip(*gathered, strict=True)))


def measure_peaks(clock: Clock, rank: int, world: int) -> list[MeasuredPeak]:
    dev = clock.device
    elems = PEAK_BYTES // 2
    src = torch.ones(elems, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    out = []
    for shift in range(1, world):
        to, frm = (rank + shift) % world, (rank - shift) % world

        group: Any = clock.group

        def exchange(to: int = to, frm: int = frm, group: Any = group) -> None:
            ops = [
                dist.P2POp(dist.isend, src, to, group=group),
                dist.P2POp(dist.irecv, dst, frm, group=group),
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()

        t = _median_slowest(clock, exchange)
        out.append(
            MeasuredPeak(
                name=f"peer_copy_shift{shift}",
                gbps=PEAK_BYTES / (t * 1e-6) / 1e9,
                bytes=PEAK_BYTES,
                definition=f"every rank sends {PEAK_BYTES >> 20} MiB to the rank {shift} on and receives as much, concurrently (NCCL send/recv in one group): bytes per rank and direction / the slowest rank's median time",
            )
        )
    a2a_in = torch.ones(elems, dtype=torch.bfloat16, device=dev)
    a2a_out = torch.empty_like(a2a_in)
    t = _median_slowest(clock, lambda: dist.all_to_all_single(a2a_out, a2a_in, group=clock.group))  # type: ignore[arg-type]
    remote = PEAK_BYTES * (world - 1) // world
    out.append(
        MeasuredPeak(
            name="a2a_algbw",
            gbps=PEAK_BYTES / (t * 1e-6) / 1e9,
            bytes=PEAK_BYTES,
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


def _matmul_us(clock: Clock) -> float:
    a = _random(MATMUL_N * MATMUL_N, 1, clock.device).view(MATMUL_N, MATMUL_N)
    b = _random(MATMUL_N * MATMUL_N, 2, clock.device).view(MATMUL_N, MATMUL_N)
    c = torch.empty_like(a)
    return _median_slowest(clock, lambda: torch.matmul(a, b, out=c))


def _copy_us(clock: Clock) -> float:
    src = _random(COPY_BYTES // 2, 3, clock.device)
    dst = torch.empty_like(src)
    return _median_slowest(clock, lambda: dst.copy_(src))


def measure_device_rates(clock: Clock) -> list[MeasuredRate]:
    """This GPU's dense bf16 matmul rate and HBM copy rate (every rank its own GPU, at the same time; the
    slowest rank's median). Each measurement's buffers are freed before the next."""
    flops, moved = 2.0 * MATMUL_N**3, 2.0 * COPY_BYTES
    t_mm, t_copy = _matmul_us(clock), _copy_us(clock)
    return [
        MeasuredRate(
            name="dense_bf16_matmul",
            value=flops / (t_mm * 1e-6) / 1e12,
            unit="TFLOP/s",
            work=flops,
            definition=f"torch.matmul of two {MATMUL_N}x{MATMUL_N} bf16 matrices: 2 n^3 FLOPs / the slowest rank's median time",
        ),
        MeasuredRate(
            name="hbm_copy",
            value=moved / (t_copy * 1e-6) / 1e9,
            unit="GB/s",
            work=moved,
            definition=f"a {COPY_BYTES >> 20} MiB device-to-device copy: bytes read + bytes written / the slowest rank's median time",
        ),
    ]
