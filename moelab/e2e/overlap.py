"""Chunked overlap of communication and expert compute.

The rank's tokens are split into N contiguous chunks. Dispatch and combine run on a communication
stream, the expert compute on a compute stream, ordered by events:

    comm:     D0 D1 C0 D2 C1 ... D(n-1) C(n-2) C(n-1)
    compute:     E0    E1    E2 ...            E(n-1)

so the dispatch of chunk i+1 and the combine of chunk i-1 run while chunk i's experts compute. Ei
waits for Di's event, Ci for Ei's. The grouping of received rows (the permute, which copies them out of
the backend's reused receive buffer) runs on the communication stream as part of Di, so the next
dispatch may overwrite that buffer while Ei computes. Tensors that cross streams are kept alive until
the end and marked with record_stream for the caching allocator.

Every backend is driven this way: it is called with the communication stream current (DeepEP V1 makes
its own stream wait for the current one before it starts, and the current one wait for it at the end).
A backend whose handle or buffers do not survive the next chunk's dispatch fails the correctness check,
which runs in the case's own mode. DeepEP's `async_finish`/event API is not used: it would save one
stream wait per chunk but needs a per-backend code path; a backend-specific schedule can come later.
On CPU the streams are no-ops and the same code runs serially, so the schedule is testable with gloo.
In backward, autograd runs each op's backward on the stream of its forward op, so the gradient
dispatches and combines land on the communication stream and the expert backward on the compute one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from moelab.e2e.layer import MoELayer, Received


def chunk_bounds(num_tokens: int, chunks: int) -> list[tuple[int, int]]:
    """`chunks` contiguous, non-empty, near-equal token ranges (fewer when there are fewer tokens)."""
    n = max(1, min(chunks, num_tokens))
    edges = [num_tokens * i // n for i in range(n + 1)]
    return [(edges[i], edges[i + 1]) for i in range(n)]


class Streams:
    """A communication and a compute stream on CUDA; no-ops elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.comm = torch.cuda.Stream(device) if self.cuda else None
        self.compute = torch.cuda.Stream(device) if self.cuda else None

    @contextlib.contextmanager
    def on(self, stream: torch.cuda.Stream | None) -> Iterator[None]:
        if stream is None:
            yield
        else:
            with torch.cuda.stream(stream):
                yield

    def record(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        return stream.record_event() if stream is not None else None

    @staticmethod
    def wait(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)

    @staticmethod
    def hand_over(t: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
        """Tell the caching allocator that `t`, made on another stream, is used on `stream`."""
        if stream is not None and t.is_cuda:
            t.record_stream(stream)

    def begin(self) -> None:
        """Both side streams start after what the current stream has enqueued (the inputs)."""
        if self.cuda:
            current = torch.cuda.current_stream()
            assert self.comm is not None and self.compute is not None
            self.comm.wait_stream(current)
            self.compute.wait_stream(current)

    def end(self) -> None:
        """The current stream continues after both side streams (the timing events see all the work)."""
        if self.cuda:
            current = torch.cuda.current_stream()
            assert self.comm is not None and self.compute is not None
            current.wait_stream(self.comm)
            current.wait_stream(self.compute)


def forward_overlapped(
    layer: MoELayer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    chunks: int,
    streams: Streams,
) -> torch.Tensor:
    """The layer over `chunks` token chunks, communication of one chunk overlapping compute of another."""
    bounds = chunk_bounds(x.shape[0], chunks)
    n = len(bounds)
    received: list[Received | None] = [None] * n
    dispatched: list[torch.cuda.Event | None] = [None] * n
    expert_outs: list[torch.Tensor | None] = [None] * n
    outs: list[torch.Tensor] = []
    streams.begin()

    def dispatch(i: int) -> None:
        a, b = bounds[i]
        with streams.on(streams.comm):
            received[i] = layer.dispatch(x[a:b], topk_idx[a:b], topk_weights[a:b])
            dispatched[i] = streams.record(streams.comm)

    dispatch(0)
    for i in range(n):
        r = received[i]
        assert r is not None
        with streams.on(streams.compute):
            streams.wait(streams.compute, dispatched[i])
            for t in (r.grouped.x, r.grouped.row, r.grouped.weight, r.grouped.offsets):
                streams.hand_over(t, streams.compute)
            y = layer.experts(r)
            computed = streams.record(streams.compute)
        expert_outs[i] = y
        if i + 1 < n:
            dispatch(i + 1)
        with streams.on(streams.comm):
            streams.wait(streams.comm, computed)
            streams.hand_over(y, streams.comm)
            outs.append(layer.combine(y, r))
    streams.end()
    current = torch.cuda.current_stream() if streams.cuda else None
    for o in outs:
        streams.hand_over(o, current)
    return torch.cat(outs) if n > 1 else outs[0]


def compute_chunked(layer: MoELayer, received: list[Received]) -> list[torch.Tensor]:
    """The expert compute of pre-dispatched chunks, back to back (the compute the overlapped layer does)."""
    return [layer.experts(r) for r in received]
