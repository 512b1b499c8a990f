"""Overlap of communication and expert compute: two micro-batches (TBO) or N token chunks.

The rank's tokens are split into micro-batches (contiguous token ranges). Dispatch and combine run on a
communication stream, the expert compute on a compute stream, ordered by events:

    comm:     L0 L1 | D0 D1 C0 D2 C1 ... D(n-1) C(n-2) C(n-1)
    compute:        |    E0    E1    E2 ...            E(n-1)

so the dispatch of micro-batch i+1 and the combine of i-1 run while i's experts compute. With n = 2 this
is the two-batch overlap of DeepSeek-V3's training and SGLang's serving (mode `tbo`): B's dispatch runs
under A's expert GEMMs, A's combine under B's. Mode `chunked` is the same pipeline with n chunks.

The layout step (routing metadata exchange, the host synchronisation of a fresh dispatch) runs once per
micro-batch, all of them before the first payload (L0 L1 above), when the backend splits layout from
dispatch (`Backend.phases`): the host then never waits for the communication stream in the middle of
the pipeline, and the payload dispatches are launched without host syncs. A backend without the split
computes its layout inside each dispatch (one host sync per micro-batch, mid-pipeline).

Ei waits for Di's event, Ci for Ei's. The grouping of received rows (the permute, which copies them out
of the backend's reused receive buffer) runs on the communication stream as part of Di, so the next
dispatch may overwrite that buffer while Ei computes. Tensors that cross streams are marked with
record_stream for the caching allocator.

Every backend is driven with the communication stream current: DeepEP V1 makes its own communication
stream wait for the current one before it starts and the current one wait for it at the end, so the
compute stream is never blocked by it; Hybrid-EP (no stream or event arguments) runs on the current
stream. DeepEP's `previous_event` / `async_finish` API gives the same order from the compute stream (its
stream waits on a recorded event, the caller waits on the returned one); with a communication stream of
our own the plain calls already order it so, one code path for every backend, and the stream waits it
would save are two per micro-batch. On CPU the streams are
no-ops and the same code runs serially, so the schedule is testable with gloo. In backward, autograd
runs each op's backward on the stream of its forward op, so the gradient dispatches and combines land
on the communication stream and the expert backward on the compute one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from moelab.measure.e2e.layer import MoELayer, Received

TBO_MICRO_BATCHES = 2


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


def forward_pipelined(
    layer: MoELayer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    micro_batches: int,
    streams: Streams,
) -> torch.Tensor:
    """The layer over `micro_batches` token ranges, communication of one overlapping compute of another."""
    bounds = chunk_bounds(x.shape[0], micro_batches)
    n = len(bounds)
    received: list[Received | None] = [None] * n
    dispatched: list[torch.cuda.Event | None] = [None] * n
    outs: list[torch.Tensor] = []
    streams.begin()
    with streams.on(streams.comm):  # every host sync of the layouts before the first payload
        layouts = [layer.layout(topk_idx[a:b], topk_weights[a:b]) for a, b in bounds]

    def dispatch(i: int) -> None:
        a, b = bounds[i]
        with streams.on(streams.comm):
            received[i] = layer.dispatch(x[a:b], topk_idx[a:b], topk_weights[a:b], layout=layouts[i])
            dispatched[i] = streams.record(streams.comm)

    dispatch(0)
    for i in range(n):
        r = received[i]
        assert r is not None
        with streams.on(streams.compute):
            streams.wait(streams.compute, dispatched[i])
            for t in r.grouped.tensors():
                streams.hand_over(t, streams.compute)
            y = layer.experts(r)
            computed = streams.record(streams.compute)
        if i + 1 < n:
            dispatch(i + 1)
        with streams.on(streams.comm):
            streams.wait(streams.comm, computed)
            streams.hand_over(y, streams.comm)
            outs.append(layer.combine(y, r))
        received[i] = None
    streams.end()
    current = torch.cuda.current_stream() if streams.cuda else None
    for o in outs:
        streams.hand_over(o, current)
    return torch.cat(outs) if n > 1 else outs[0]


def compute_chunked(layer: MoELayer, received: list[Received]) -> list[torch.Tensor]:
    """The expert compute of pre-dispatched micro-batches, back to back (what the overlapped layer computes)."""
    return [layer.experts(r) for r in received]
