"""The GEMM slowdown that communication causes: GEMMs timed on their own stream while dispatch and combine
run on another.

Every SM a communication kernel holds is an SM the expert GEMMs lose, and both contend for memory
bandwidth. A call enqueues the GEMMs on the compute stream first, bracketed by CUDA events on that
stream, then the communication on the communication stream, so the two run concurrently and the events
time the GEMMs alone. The caller picks a communication that lasts longer than the GEMMs (the whole
batch's dispatch+combine against one micro-batch's GEMMs) so that the GEMMs run under it throughout.
On CPU there is no concurrency: the GEMMs are timed with a monotonic clock, then the communication runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from moelab.measure.e2e.overlap import Streams


class ConcurrentGemm:
    """A callable for Clock.sample: each call times `gemm` under `comm`; `samples` reads the times back."""

    def __init__(self, streams: Streams, gemm: Callable[[], object], comm: Callable[[], object]) -> None:
        self.streams = streams
        self.gemm = gemm
        self.comm = comm
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu_us: list[float] = []

    def __call__(self) -> None:
        s = self.streams
        s.begin()
        with s.on(s.compute):
            if s.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.gemm()
                end.record()
                self._events.append((start, end))
            else:
                t0 = time.perf_counter_ns()
                self.gemm()
                self._cpu_us.append((time.perf_counter_ns() - t0) / 1e3)
        with s.on(s.comm):
            self.comm()
        s.end()

    def samples(self, iters: int) -> list[float]:
        """The GEMM times (µs) of the last `iters` calls; on GPU the events must have completed."""
        if self.streams.cuda:
            return [a.elapsed_time(b) * 1e3 for a, b in self._events[-iters:]]
        return list(self._cpu_us[-iters:])
