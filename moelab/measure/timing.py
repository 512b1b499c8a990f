"""Timing of one rank's iterations: CUDA events on GPU, a monotonic clock on CPU.

Before each timed iteration every rank passes a barrier (on GPU an all-reduce enqueued on the stream,
so the start events line up without a host sync), and on GPU a buffer larger than L2 is overwritten so
each iteration starts cold, as DeepEP's bench does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

L2_FLUSH_BYTES = 256 * 1024 * 1024


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
        if self.cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            for i in range(iters):
                if self._flush is not None:
                    self._flush.zero_()
                self._barrier()
                starts[i].record()
                for _ in range(repeat):
                    fn()
                ends[i].record()
            torch.cuda.synchronize(self.device)
            times = [s.elapsed_time(e) * 1e3 / repeat for s, e in zip(starts, ends, strict=True)]
        else:
            times = []
            for _ in range(iters):
                self._barrier()
                t0 = time.perf_counter_ns()
                for _ in range(repeat):
                    fn()
                times.append((time.perf_counter_ns() - t0) / 1e3 / repeat)
        self.sync()
        return times
