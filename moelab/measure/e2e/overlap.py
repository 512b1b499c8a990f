"""Overlap of communication and expert compute: two micro-batches (TBO), N token chunks, N expert groups
(mode expert: `expert_parts`, every token routed to one group of experts at a time, the outputs summed),
or token micro-batches on one stream with the receive deferred to a hook (`forward_hooked`, comm = hook).

The rank's tokens are split into micro-batches (contiguous token ranges; or, for expert groups, parts
that each carry every token with a masked routing). Dispatch and combine run on a
communication stream, the expert compute on a compute stream, ordered by events:

    comm:     L0 L1 | D0 D1 C0 D2 C1 ... D(n-1) C(n-2) C(n-1)
    compute:        |    E0    E1    E2 ...            E(n-1)

so the dispatch of micro-batch i+1 and the combine of i-1 run while i's experts compute. With n = 2 this
is the two-batch overlap of DeepSeek-V3's training and SGLang's serving (mode `tbo`): B's dispatch runs
under A's expert GEMMs, A's combine under B's. Mode `chunked` is the same pipeline with n chunks.

The layout step (routing metadata exchange, the host synchronisation of a fresh dispatch) runs once per
micro-batch, all of them before the first payload (L0 L1 above), when the backend splits layout from
dispatch (`Backend.phases`). So do the grouping's pair counts (MoELayer.part_layouts): with the fewest
host reads the backend allows (one count exchange and one read for every micro-batch's layout and pair
counts where it lays them out together, BatchedLayout; none of the layer's own where its dispatch reads
them, HostExpertCounts; else moelab.measure.e2e.pair_counts, one all-reduce launched ahead of the layouts
and one read after them): the grouping of a received micro-batch then sizes its gather from them instead
of reading the count after the dispatch. The host then never waits for the device in
the middle of the pipeline, and enqueues micro-batch i+1's dispatch while i's GEMMs run. A backend whose
dispatch itself waits on the host (DeepEP V1's fresh dispatch, Hybrid-EP's, a backend without the layout
split) still syncs once per micro-batch inside it. `host_counts=False` keeps the old syncing grouping (the
tests compare the two bit for bit).

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
from dataclasses import dataclass
from typing import Any

import torch

from moelab.measure.e2e.layer import MoELayer, Received, Sent
from moelab.measure.e2e.pair_counts import start_pair_counts
from moelab.measure.e2e.schedules import expert_group_routing

TBO_MICRO_BATCHES = 2


def chunk_bounds(num_tokens: int, chunks: int) -> list[tuple[int, int]]:
    """`chunks` contiguous, non-empty, near-equal token ranges (fewer when there are fewer tokens)."""
    n = max(1, min(chunks, num_tokens))
    edges = [num_tokens * i // n for i in range(n + 1)]
    return [(edges[i], edges[i + 1]) for i in range(n)]


HIGHEST_PRIORITY = -(2**10)  # below any device's range: torch clamps it to the highest it has
GREEN_SM_STEP = 8  # SMs per green-context partition step on SM90 (cuDevSmResourceSplitByCount's granularity)


def green_contexts_available() -> bool:
    """torch exposes CUDA green contexts (SM partitions with a stream each) in this build."""
    try:
        from torch.cuda import green_contexts
    except ImportError:
        return False
    return bool(getattr(green_contexts, "SUPPORTED", False))


class Streams:
    """A communication and a compute stream on CUDA; no-ops elsewhere.

    With `comm_sms` (the `partition` schedule) and green contexts in torch, each stream belongs to its own
    green context: the communication's holds `comm_sms` SMs, the compute's the rest, so the GEMMs' SM count
    is fixed whatever the communication kernels ask for (`gemm_sms`). Without green contexts the partition
    is the backend's SM control plus the GEMM carve-out, and `gemm_sms` stays None here.

    With `priority` (comm = priority) the communication stream is created at the device's highest
    priority: the block scheduler then starts its kernels' blocks ahead of the pending blocks of a GEMM
    launched earlier on the compute stream, as SMs free up. At equal priority they wait until the GEMM's
    last block has been issued, so a communication kernel enqueued under a long GEMM runs at its tail.
    `comm_priority` is the priority the stream got (0: the default)."""

    def __init__(self, device: torch.device, comm_sms: int | None = None, priority: bool = False) -> None:
        self.cuda = device.type == "cuda"
        self.gemm_sms: int | None = None
        self.comm: torch.cuda.Stream | None = None
        self.compute: torch.cuda.Stream | None = None
        self._contexts: tuple[Any, ...] = ()  # the green contexts, kept alive while their streams are
        self.partition_note = ""  # why the partition is not on green contexts, where asked and not
        if self.cuda and comm_sms:
            self._green(device, comm_sms)
        if self.cuda and self.comm is None:
            # torch maps a priority past the device's range to its highest (the lowest number)
            self.comm = torch.cuda.Stream(device, priority=HIGHEST_PRIORITY if priority else 0)
            self.compute = torch.cuda.Stream(device)

    def _green(self, device: torch.device, comm_sms: int) -> None:
        """The two streams on green contexts of `comm_sms` SMs and the rest, each a multiple of the SM
        granularity a partition takes on Hopper (8); the note says why not where torch or the driver
        cannot (the partition is then the backend's SM control and the GEMM carve-out)."""
        if not green_contexts_available():
            self.partition_note = f"torch {torch.__version__} has no CUDA green contexts"
            return
        from torch.cuda.green_contexts import GreenContext

        total = torch.cuda.get_device_properties(device).multi_processor_count
        comm = -(-comm_sms // GREEN_SM_STEP) * GREEN_SM_STEP
        gemm = (total - comm) // GREEN_SM_STEP * GREEN_SM_STEP
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            comm_ctx: Any = GreenContext.create(num_sms=comm, device_id=index)
            compute_ctx: Any = GreenContext.create(num_sms=gemm, device_id=index)
            streams = comm_ctx.Stream(), compute_ctx.Stream()
        except Exception as exc:  # the driver refuses the split: say so, fall back to the carve-out
            self.partition_note = (
                f"green contexts of {comm} + {gemm} SMs refused: {str(exc).splitlines()[0][:200]}"
            )
            return
        self._contexts = (comm_ctx, compute_ctx)
        self.comm, self.compute = streams
        self.gemm_sms = gemm

    @property
    def comm_priority(self) -> int:
        return int(self.comm.priority) if self.comm is not None else 0

    @property
    def partitioned(self) -> bool:
        return self.gemm_sms is not None

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


@dataclass(frozen=True, slots=True)
class Part:
    """One stage of a pipelined layer: the rows it dispatches and their (possibly masked) routing."""

    x: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor


def token_parts(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, n: int) -> list[Part]:
    """`n` token micro-batches (tbo, chunked): their outputs concatenate to the layer's."""
    return [Part(x[a:b], topk_idx[a:b], topk_weights[a:b]) for a, b in chunk_bounds(x.shape[0], n)]


def expert_parts(
    x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, experts_per_rank: int, n: int
) -> list[Part]:
    """`n` expert groups (mode expert): every token, routed to one group of experts each; their outputs
    sum to the layer's."""
    return [Part(x, i, w) for i, w in expert_group_routing(topk_idx, topk_weights, experts_per_rank, n)]


def schedule_parts(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    mode: str,
    chunks: int,
    experts_per_rank: int,
) -> list[Part]:
    """The parts an overlapped schedule computes: `chunks` expert groups in mode expert, none in mode columns
    (it computes on the whole batch's rows: moelab.measure.e2e.columns), else token chunks."""
    if mode == "columns":
        return []
    if mode == "expert":
        return expert_parts(x, topk_idx, topk_weights, experts_per_rank, chunks)
    return token_parts(x, topk_idx, topk_weights, chunks)


def join(outs: list[torch.Tensor], summed: bool) -> torch.Tensor:
    if len(outs) == 1:
        return outs[0]
    if not summed:
        return torch.cat(outs)
    total = outs[0]
    for o in outs[1:]:
        total = total + o  # not in place: each is a combine's output that autograd may hold
    return total


def forward_pipelined(
    layer: MoELayer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    micro_batches: int,
    streams: Streams,
    host_counts: bool = True,
) -> torch.Tensor:
    """The layer over `micro_batches` token ranges, communication of one overlapping compute of another."""
    parts = token_parts(x, topk_idx, topk_weights, micro_batches)
    return join(run_pipeline(layer, parts, streams, host_counts), False)


def forward_expert_pipelined(
    layer: MoELayer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    groups: int,
    streams: Streams,
    host_counts: bool = True,
) -> torch.Tensor:
    """The layer over `groups` expert groups: group g+1's dispatch and g-1's combine under g's GEMMs."""
    parts = expert_parts(x, topk_idx, topk_weights, layer.experts_per_rank, groups)
    return join(run_pipeline(layer, parts, streams, host_counts), True)


def run_pipeline(
    layer: MoELayer, parts: list[Part], streams: Streams, host_counts: bool = True
) -> list[torch.Tensor]:
    """Each part's combined output, in order, communication on the comm stream beside the compute.
    `host_counts`: read every part's pair counts up front (no host sync per part); False: per part."""
    with layer.deferring(len(parts)):  # the parts' weight gradient, once (moelab.measure.e2e.wgrad)
        return _run_pipeline(layer, parts, streams, host_counts)


def _run_pipeline(
    layer: MoELayer, parts: list[Part], streams: Streams, host_counts: bool
) -> list[torch.Tensor]:
    n = len(parts)
    received: list[Received | None] = [None] * n
    dispatched: list[torch.cuda.Event | None] = [None] * n
    outs: list[torch.Tensor] = []
    streams.begin()
    with streams.on(streams.comm):  # every host sync of the layouts and pair counts before the first payload
        layouts, counts = layer.part_layouts([(p.topk_idx, p.topk_weights) for p in parts], host_counts)

    def dispatch(i: int) -> None:
        p = parts[i]
        with streams.on(streams.comm):
            received[i] = layer.dispatch(p.x, p.topk_idx, p.topk_weights, layout=layouts[i], counts=counts[i])
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
    return outs


def forward_hooked(
    layer: MoELayer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    micro_batches: int,
    streams: Streams,
    host_counts: bool = True,
) -> torch.Tensor:
    """Token micro-batches on one stream with the receive deferred (`comm = hook`): the send of i+1 is
    launched before i's expert GEMMs and its receive hook called after them, so between the two no
    dispatch kernel holds an SM (DeepEP's low-latency overlap, its tests' `return_recv_hook=True`). The
    pair counts of every micro-batch are read once before the first send (`host_counts`)."""
    parts = token_parts(x, topk_idx, topk_weights, micro_batches)
    counts: list[tuple[int, ...] | None] = [None] * len(parts)
    if host_counts:
        counts = list(
            start_pair_counts(layer.backend, [p.topk_idx for p in parts], layer.experts_per_rank).result()
        )
    hooks: list[Sent | None] = [None] * len(parts)
    outs: list[torch.Tensor] = []
    with layer.deferring(len(parts)):  # the parts' weight gradient, once (moelab.measure.e2e.wgrad)
        hooks[0] = layer.send(parts[0].x, parts[0].topk_idx, parts[0].topk_weights)
        for i in range(len(parts)):
            hook = hooks[i]
            assert hook is not None
            r = layer.receive(hook, counts[i])
            if i + 1 < len(parts):
                p = parts[i + 1]
                hooks[i + 1] = layer.send(p.x, p.topk_idx, p.topk_weights)
            outs.append(layer.combine(layer.experts(r), r))
    return join(outs, False)


def compute_chunked(layer: MoELayer, received: list[Received]) -> list[torch.Tensor]:
    """The expert compute of pre-dispatched micro-batches, back to back (what the overlapped layer computes,
    with the parts' GEMM)."""
    with layer.parts():
        return [layer.experts(r) for r in received]
