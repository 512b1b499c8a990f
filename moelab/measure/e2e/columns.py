"""Mode `columns`: the layer's tail pipelined over slices of the hidden columns (issue 37).

The batch is dispatched whole and its first GEMM and activation run whole. The second GEMM, the
un-permute and the combine then run one slice of the hidden columns at a time:

    compute:  GEMM1+act | Y0 U0 | Y1 U1 | Y2 U2 | Y3 U3 |
    comm:     D         |       | C0    | C1    | C2    | C3

where Yj = a @ W2[:, :, slice j] (every expert's rows, full K), Uj its un-permute, Cj its combine. Each
expert keeps all its rows, so the grouped GEMM's tiles are as full as the serial layer's (a token split
halves the rows per expert: at 128 experts per rank its micro-batches' GEMMs cost 1.5x the whole batch's
on H100, results/h100x2-r9), and each byte crosses the wire once (an expert split sends a token once per
group). What it hides is the combine; the dispatch stays exposed.

Backward runs the same pipeline in reverse, in one autograd Function: slice j's output gradient is
dispatched along the forward's handle on the communication stream while slice j-1's input gradient
(un-permute backward, dA += dYj @ W2jᵀ) computes; the weight gradient of W2 is one grouped GEMM over
the slices' pair gradients side by side, after the last. The head's backward (activation, first GEMM,
permute, the dispatch's combine) is autograd's, as in the serial layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from moelab.measure.e2e.activation import swiglu
from moelab.measure.e2e.grouped_gemm import triton_grouped_swiglu
from moelab.measure.e2e.layer import Grouped, MoELayer, Received, grouped_matmul
from moelab.measure.e2e.overlap import Streams
from moelab.measure.e2e.permute import unpermute, unpermute_grad
from moelab.measure.e2e.schedules import column_bounds, column_unit
from moelab.measure.e2e.wgrad import grouped_wgrad


def column_gemm(layer: MoELayer, pairs: int) -> str:
    """The GEMM the schedule runs: the grouped kernel wherever the layer's is grouped, grouped-wide or
    padded (the whole batch's rows per expert: the wide tile already), the Triton one where the layer's
    is, the loop where the layer's is or no pair landed (torch's grouped backward refuses empty rows)."""
    if layer.gemm == "loop" or pairs == 0:
        return "loop"
    return "triton" if layer.gemm == "triton" else "grouped"


@dataclass(frozen=True, slots=True)
class Tail:
    """What the pipelined tail needs besides the activation and W2: the grouping, the handle, the slices."""

    layer: MoELayer
    grouped: Grouped
    handle: Any
    bounds: Sequence[tuple[int, int]]
    streams: Streams
    impl: str
    ends: list[int] | None  # the grouping's offsets on the host, where known (the loop's sizes)

    def gemm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return grouped_matmul(x, w, self.grouped.offsets, self.impl, self.ends, self.grouped.map.max_group)


def tail_forward(t: Tail, a: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """[T, H]: slice j's second GEMM and un-permute on the compute stream, its combine on the
    communication stream once they are done; the slices' outputs side by side."""
    s, backend = t.streams, t.layer.backend
    outs: list[torch.Tensor] = []
    s.begin()
    for lo, hi in t.bounds:
        with s.on(s.compute):
            rows = unpermute(t.gemm(a, w2[:, :, lo:hi]), t.grouped.map, t.layer.permute)
            done = s.record(s.compute)
        with s.on(s.comm):
            s.wait(s.comm, done)
            s.hand_over(rows, s.comm)
            outs.append(backend.combine(rows, t.handle))
    s.end()
    current = torch.cuda.current_stream() if s.cuda else None
    for o in outs:
        s.hand_over(o, current)
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


def tail_backward(
    t: Tail, a: torch.Tensor, w2: torch.Tensor, grad_out: torch.Tensor, want_w2: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dA, dW2): slice j's output gradient dispatched along the handle on the communication stream, its
    input gradient on the compute stream; dW2 once over every slice's pair gradients."""
    s, backend, m = t.streams, t.layer.backend, t.grouped.map
    grad_a: torch.Tensor | None = None
    pair_grads: list[torch.Tensor] = []
    s.begin()
    for lo, hi in t.bounds:
        with s.on(s.comm):
            rows = backend.dispatch_with_handle(  # type: ignore[attr-defined]
                grad_out[:, lo:hi].to(torch.bfloat16).contiguous(), t.handle
            )
            arrived = s.record(s.comm)
        with s.on(s.compute):
            s.wait(s.compute, arrived)
            s.hand_over(rows, s.compute)
            dy = unpermute_grad(rows, m, t.layer.permute)
            da = t.gemm(dy, w2[:, :, lo:hi].transpose(1, 2))
            grad_a = da if grad_a is None else grad_a.add_(da)
            pair_grads.append(dy)
    grad_w2 = None
    with s.on(s.compute):
        if want_w2:
            dy_all = torch.cat(pair_grads, dim=1) if len(pair_grads) > 1 else pair_grads[0]
            grad_w2 = _weight_grad(t, a, dy_all, w2)
    s.end()
    assert grad_a is not None  # bounds is never empty (column_bounds of a checked hidden)
    current = torch.cuda.current_stream() if s.cuda else None
    for g in (grad_a, grad_w2):
        if g is not None:
            s.hand_over(g, current)
    return grad_a, grad_w2


def _weight_grad(t: Tail, a: torch.Tensor, dy: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """[E, I, H]: per expert, its rows of a transposed times its rows of dy."""
    if t.impl in ("grouped", "triton"):
        return grouped_wgrad(a, dy, t.grouped.offsets)
    ends = t.ends if t.ends is not None else t.grouped.offsets.tolist()
    out = torch.zeros_like(w2)
    for e, (lo, hi) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        if hi > lo:
            out[e] = a[lo:hi].t() @ dy[lo:hi]
    return out


class _TailFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, w2: torch.Tensor, t: Tail) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, w2)
        ctx.tail = t
        return tail_forward(t, a, w2)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, w2 = ctx.saved_tensors
        grad_a, grad_w2 = tail_backward(ctx.tail, a, w2, grad_out, ctx.needs_input_grad[1])
        return grad_a, grad_w2, None


def head(layer: MoELayer, g: Grouped, impl: str, ends: list[int] | None) -> torch.Tensor:
    """The first GEMM and the activation of every pair: [P, I] (autograd records them where it records;
    the Triton GEMM fuses the activation)."""
    if impl == "triton":
        return triton_grouped_swiglu(g.x, layer.weights.w13, g.offsets, g.map.max_group)
    h = grouped_matmul(g.x, layer.weights.w13, g.offsets, impl, ends, g.map.max_group)
    return swiglu(h, layer.permute)


def slices(layer: MoELayer, chunks: int) -> list[tuple[int, int]]:
    hidden = int(layer.weights.w2.shape[2])
    bounds = column_bounds(hidden, chunks, column_unit(layer.backend))
    if not bounds:  # schedule_reason refuses this before any kernel; a direct caller gets told too
        raise ValueError(f"mode columns cannot slice hidden {hidden} on {layer.backend.name}")
    return bounds


def _tail(layer: MoELayer, received: Received, chunks: int, streams: Streams) -> tuple[Tail, torch.Tensor]:
    g = received.grouped
    ends = g.host_ends()
    impl = column_gemm(layer, g.num_pairs)
    t = Tail(layer, g, received.handle, slices(layer, chunks), streams, impl, ends)
    return t, head(layer, g, impl, ends)


def forward_column_pipelined(
    layer: MoELayer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    chunks: int,
    streams: Streams,
) -> torch.Tensor:
    """The layer with its tail in `chunks` column slices, each slice's combine beside the next's GEMM.
    The layout and pair counts go first, in the backend's fewest host reads, as the serial layer's."""
    layouts, counts = layer.part_layouts([(topk_idx, topk_weights)])
    received = layer.dispatch(x, topk_idx, topk_weights, layout=layouts[0], counts=counts[0])
    t, a = _tail(layer, received, chunks, streams)
    w2 = layer.weights.w2
    if torch.is_grad_enabled() and (a.requires_grad or w2.requires_grad):
        return _TailFn.apply(a, w2, t)  # type: ignore[no-any-return]
    return tail_forward(t, a, w2)


def column_compute(layer: MoELayer, received: Received, chunks: int) -> torch.Tensor:
    """The schedule's expert compute alone on dispatched rows, slice by slice, no communication (the
    `compute_only_split` op: what slicing the second GEMM and the un-permute costs by itself)."""
    t, a = _tail(layer, received, chunks, Streams(torch.device("cpu")))
    outs = [
        unpermute(t.gemm(a, layer.weights.w2[:, :, lo:hi]), t.grouped.map, layer.permute)
        for lo, hi in t.bounds
    ]
    return torch.cat(outs, dim=1)
