"""Timing of one rank's iterations: CUDA events on GPU, a monotonic clock on CPU, and when to stop.

Before each timed iteration every rank passes a barrier (on GPU an all-reduce enqueued on the stream,
so the start events line up without a host sync), and on GPU a buffer larger than L2 is overwritten so
each iteration starts cold, as DeepEP's bench does. Iterations run in batches; after each batch the ranks
share their times, and all of them stop together once the median is known well enough (nvbench's stdrel
idea: a noise target after a minimum count and time, with a maximum count).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from moelab.core.spec import TimingSpec

L2_FLUSH_BYTES = 256 * 1024 * 1024


def median_noise(per_iter: np.ndarray) -> float:
    """Relative half-width of a ~95% distribution-free confidence interval of the median (order statistics
    n/2 ± 0.98·sqrt(n)); inf below 6 samples. The figure the stopping rule and the record use."""
    n = int(per_iter.size)
    if n < 6:
        return math.inf
    s = np.sort(per_iter)
    half = 0.98 * math.sqrt(n)
    lo = s[max(0, int(math.floor(n / 2 - half)))]
    hi = s[min(n - 1, int(math.ceil(n / 2 + half)))]
    med = float(np.median(s))
    return float((hi - lo) / (2 * med)) if med > 0 else math.inf


@dataclass(frozen=True, kw_only=True, slots=True)
class Sampled:
    samples_us: list[list[float]]  # [rank][iteration]
    noise: float  # achieved median_noise of the slowest-rank iteration times
    seconds: float  # wall time spent timing
    library_samples_us: list[list[float]] | None = None  # [rank][call]: the same op timed the library's way


class Clock:
    def __init__(self, device: torch.device, group: object, flush_l2: bool) -> None:
        self.device = device
        self.group = group
        self.cuda = device.type == "cuda"
        self._token = torch.zeros(1, device=device)
        self._flush = (
            torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
            if (self.cuda and flush_l2)
            else None
        )

    def _barrier(self) -> None:
        if self.cuda:
            dist.all_reduce(self._token, group=self.group)  # type: ignore[arg-type]
        else:
            dist.barrier(group=self.group)  # type: ignore[arg-type]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)  # type: ignore[arg-type]

    def sample(self, fn: Callable[[], object], iters: int, warmup: int, repeat: int = 1) -> list[float]:
        """Microseconds per call of `fn`, one sample per iteration (each sample covers `repeat` calls)."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = self._batch(fn, iters, repeat)
        self.sync()
        return times

    def _batch(
        self, fn: Callable[[], object], iters: int, repeat: int = 1, host_aligned: bool = False
    ) -> list[float]:
        """`host_aligned`: for an op that synchronizes the host inside, start each iteration from an idle
        GPU with every rank's host past a barrier (as the libraries' own benches find it), so the op's
        internal sync does not wait on the flush and barrier queued ahead of it (a wait whose length
        depends on how fast the host thread wakes: what made such ops bimodal between runs)."""
        reads = [self._iteration(fn, repeat, host_aligned) for _ in range(iters)]
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return [read() for read in reads]

    def _iteration(self, fn: Callable[[], object], repeat: int, host_aligned: bool) -> Callable[[], float]:
        """One timed iteration (cold L2, ranks aligned); returns how to read its microseconds per call once
        the device has finished (on GPU the events are read after one synchronize for the whole batch)."""
        if not self.cuda:
            self._barrier()
            t0 = time.perf_counter_ns()
            for _ in range(repeat):
                fn()
            us = (time.perf_counter_ns() - t0) / 1e3 / repeat
            return lambda: us
        if self._flush is not None:
            self._flush.zero_()
        if host_aligned:
            torch.cuda.synchronize(self.device)
            dist.barrier(group=self.group)  # type: ignore[arg-type]
            torch.cuda.synchronize(self.device)
        else:
            self._barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        return lambda: start.elapsed_time(end) * 1e3 / repeat

    def sample_interleaved(
        self, fns: Sequence[Callable[[], object]], iters: int, warmup: int
    ) -> list[list[float]]:
        """Microseconds per iteration of each of `fns`, their iterations interleaved: iteration i runs
        every fn once, in order on even i and in reverse on odd i (A B, B A, ...). Two ops compared as a
        ratio (a schedule against its serial layer) then see the same clocks, power and communicator
        state: timed one block after the other, the same serial layer read 0.905-1.070x itself on 4 x H200
        (results/h200x4-r15)."""
        for fn in fns:
            for _ in range(warmup):
                fn()
        self.sync()
        reads: list[list[Callable[[], float]]] = [[] for _ in fns]
        for i in range(iters):
            for k in range(len(fns)) if i % 2 == 0 else reversed(range(len(fns))):
                reads[k].append(self._iteration(fns[k], 1, False))
        if self.cuda:
            torch.cuda.synchronize(self.device)
        times = [[read() for read in per_fn] for per_fn in reads]
        self.sync()
        return times

    def _share(self, times: list[float]) -> list[list[float]]:
        """Every rank's batch, on every rank (small: one float per iteration)."""
        world = dist.get_world_size(self.group)  # type: ignore[arg-type]
        local = torch.tensor(times, dtype=torch.float64)
        if self.cuda:
            local = local.to(self.device)
        out = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(out, local, group=self.group)  # type: ignore[arg-type]
        return [t.cpu().tolist() for t in out]

    def sample_back_to_back(
        self, fn: Callable[[], object], iters: int = 50, warmup: int = 20
    ) -> list[list[float]]:
        """Every rank's times of `iters` back-to-back calls, as DeepEP's and Hybrid-EP's own benches time
        (tests/utils.py bench): warm-up, one L2 flush, an event pair per call, no barrier between calls."""
        for _ in range(warmup):
            fn()
        if self._flush is not None:
            self._flush.zero_()
        self.sync()
        if self.cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            for i in range(iters):
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize(self.device)
            times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]
        else:
            times = []
            for _ in range(iters):
                t0 = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - t0) / 1e3)
        shared = self._share(times)
        self.sync()
        return shared

    def sample_until_stable(
        self, fn: Callable[[], object], timing: TimingSpec, host_aligned: bool = False, repeat: int = 1
    ) -> Sampled:
        """Warm up, then time batches until the slowest-rank median's noise is under the target (after
        `min_iters` and `min_time_s`) or `max_iters` is reached; every rank stops at the same batch.
        `repeat`: calls of `fn` back to back per timed iteration, each sample their time over `repeat`."""
        for _ in range(timing.warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        per_rank: list[list[float]] | None = None
        noise = math.inf
        least, most = timing.bounds
        step = most if timing.iters is not None else timing.batch
        while True:
            done = 0 if per_rank is None else len(per_rank[0])
            batch = min(step, most - done)
            shared = self._share(self._batch(fn, batch, repeat=repeat, host_aligned=host_aligned))
            per_rank = shared if per_rank is None else [a + b for a, b in zip(per_rank, shared, strict=True)]
            n = len(per_rank[0])
            noise = median_noise(np.asarray(per_rank).max(axis=0))
            elapsed = time.perf_counter() - t0
            enough = n >= least and elapsed >= timing.min_time_s and noise <= timing.noise_target
            if enough or n >= most:
                break
        self.sync()
        return Sampled(samples_us=per_rank, noise=noise, seconds=time.perf_counter() - t0)
