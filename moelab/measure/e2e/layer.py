"""The MoE layer of the end-to-end benchmark: dispatch → per-expert SwiGLU FFN → combine, on one rank.

Expert weights and tokens come from a counter-based hash of (what, seed, id, element index) computed
with int64 arithmetic that never overflows, so every rank, the single-process reference and the CPU
tests build bit-identical values on any device without generating gigabytes on the host.

Expert FFN (SwiGLU, gate and up projections fused as in Megatron's fc1):
    h = x @ W13[e]  (W13: [H, 2I]);  a = silu(h[:, :I]) * h[:, I:];  y = a @ W2[e]  (W2: [I, H]).
Intermediate size I defaults to hidden // 4 (2048 at hidden 8192): the fine-grained experts that topk-8
models use are narrow (DeepSeek-V3: hidden 7168, expert 2048; Qwen3-235B-A22B: hidden 4096, expert
1536, i.e. 0.29 and 0.375 of hidden); the knob `intermediate` sets it.

Rows are grouped by local expert: a received row with several local experts is replicated once per
expert (a (row, expert) pair), the pairs sorted by expert (the permute), the grouped GEMMs run over
contiguous groups, and each row's pair outputs are gathered back in token order and summed with their
routing weights in float32 before combine (the un-permute; moelab.measure.e2e.permute, deterministic
forward and backward, Triton kernels on CUDA where triton is installed). Grouping needs the number of
pairs on the host (it sizes the gather): the overlapped schedules read every micro-batch's per-expert pair
counts once per layer before the first payload (moelab.measure.e2e.pair_counts) and pass them in; without
them (the serial layer) grouping reads them after the dispatch, one host sync.

Backward: the gradient of dispatch is a combine of the received rows' gradients along the same handle;
the gradient of combine is a dispatch of the output gradient along the same handle, which needs the
backend's capability DispatchAlongHandle, `dispatch_with_handle(rows, handle)` (every built-in backend has it: nccl-a2a and
mxfp8-a2a an all_to_all_single along the splits, DeepEP V1 `Buffer.dispatch(x, handle=...)`, Hybrid-EP
`HybridEPBuffer.dispatch(hidden, handle=...)`), and may say why it cannot for a case through
`dispatch_with_handle_reason()` (HandleDispatchReason, asked after prepare). Routing weights are inputs, not parameters: no
gradient flows to them (the router is not part of the layer).

Layout: where the backend splits the layout step from the payload (`Backend.phases`, with
`layout(topk_idx, topk_weights)` and `dispatch(..., layout=...)`), the schedules compute a micro-batch's
layout once, ahead of its dispatch; otherwise dispatch computes it (`MoELayer.layout` returns None).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from moelab.backends.base import Backend, Dispatched
from moelab.backends.capabilities import (
    BatchedLayout,
    DispatchAlongHandle,
    HandleDispatchReason,
    HostExpertCounts,
    PartLayouts,
    RecvHook,
)
from moelab.core.e2e_spec import GEMM_IMPLS
from moelab.core.errors import SpecError
from moelab.measure.e2e.activation import swiglu
from moelab.measure.e2e.grouped_gemm import triton_grouped_mm, triton_grouped_swiglu, unavailable_reason
from moelab.measure.e2e.pair_counts import start_pair_counts
from moelab.measure.e2e.permute import PairMap, pair_map, permute, unpermute
from moelab.measure.e2e.wgrad import DEFERRED_IMPLS, DeferredWgrad

GEMM_ALIGN = 8  # _grouped_mm's CUTLASS path wants 16-byte aligned rows: bf16 dims that are multiples of 8

_PRIME = 2_147_483_647  # 2^31 - 1: (h < 2^31) * (a < 2^31) + b stays below 2^63, so int64 never overflows
_SHIFTS = (13, 11, 15)


def _hash_params(*key: object) -> list[int]:
    digest = hashlib.sha256(":".join(str(k) for k in key).encode()).digest()
    return [int.from_bytes(digest[4 * i : 4 * i + 4], "little") % (_PRIME - 2) + 2 for i in range(8)]


def hashed_uniform(
    key: tuple[object, ...], shape: tuple[int, ...], device: torch.device | str
) -> torch.Tensor:
    """float32 values uniform in (-1, 1) (24-bit resolution), a pure function of `key` and the element
    index: the same bits on every device. Three rounds of multiply-add modulo 2^31-1 and xorshift."""
    p = _hash_params(*key)
    num = 1
    for s in shape:
        num *= s
    h = (torch.arange(num, dtype=torch.int64, device=device) + p[0]) % _PRIME
    for (a, b), shift in zip(((p[1], p[2]), (p[3], p[4]), (p[5], p[6])), _SHIFTS, strict=True):
        h = (h * a + b) % _PRIME
        h = h ^ (h >> shift)
    u = ((h & 0xFFFFFF).to(torch.float32) + 0.5) * (2.0 / 16777216.0) - 1.0
    return u.view(shape)


def hashed_normal_like(
    key: tuple[object, ...], shape: tuple[int, ...], std: float, device: torch.device | str
) -> torch.Tensor:
    """Uniform values scaled to standard deviation `std` (a uniform on (-√3σ, √3σ) has variance σ²)."""
    return hashed_uniform(key, shape, device) * (std * 3.0**0.5)


def layer_tokens(
    seed: int, rank: int, num_tokens: int, hidden: int, device: torch.device | str
) -> torch.Tensor:
    """The layer's input on `rank`: [T, H] bf16, unit variance."""
    return hashed_normal_like(("e2e-tokens", seed, rank, hidden), (num_tokens, hidden), 1.0, device).to(
        torch.bfloat16
    )


def output_grad(
    seed: int, rank: int, num_tokens: int, hidden: int, device: torch.device | str
) -> torch.Tensor:
    """The gradient fed to the layer's output in forward+backward: [T, H] bf16."""
    return hashed_normal_like(("e2e-grad", seed, rank, hidden), (num_tokens, hidden), 1.0, device).to(
        torch.bfloat16
    )


def expert_weight(
    seed: int, expert: int, hidden: int, intermediate: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global expert `expert`'s (W13 [H, 2I], W2 [I, H]) in bf16; std 1/√fan_in keeps activations O(1)."""
    w13 = hashed_normal_like(
        ("e2e-w13", seed, expert, hidden, intermediate), (hidden, 2 * intermediate), hidden**-0.5, device
    )
    w2 = hashed_normal_like(
        ("e2e-w2", seed, expert, hidden, intermediate), (intermediate, hidden), intermediate**-0.5, device
    )
    return w13.to(torch.bfloat16), w2.to(torch.bfloat16)


@dataclass(slots=True)
class ExpertWeights:
    """One rank's experts, stacked for the grouped GEMM: w13 [E, H, 2I], w2 [E, I, H]."""

    w13: torch.Tensor
    w2: torch.Tensor
    first_expert: int  # global id of local expert 0

    @property
    def num_experts(self) -> int:
        return int(self.w13.shape[0])

    @property
    def intermediate(self) -> int:
        return int(self.w2.shape[1])

    def zero_grad(self) -> None:
        self.w13.grad = None
        self.w2.grad = None


def local_expert_weights(
    seed: int,
    rank: int,
    experts_per_rank: int,
    hidden: int,
    intermediate: int,
    device: torch.device,
    requires_grad: bool = False,
) -> ExpertWeights:
    first = rank * experts_per_rank
    pairs = [expert_weight(seed, first + e, hidden, intermediate, device) for e in range(experts_per_rank)]
    w13 = torch.stack([p[0] for p in pairs]).requires_grad_(requires_grad)
    w2 = torch.stack([p[1] for p in pairs]).requires_grad_(requires_grad)
    return ExpertWeights(w13=w13, w2=w2, first_expert=first)


def resolve_gemm(requested: str, device: torch.device, hidden: int, intermediate: int) -> str:
    """ "grouped" (torch._grouped_mm) or "loop" (one matmul per expert). auto: grouped on CUDA SM90+ with
    aligned dims, where torch routes bf16 to its CUTLASS grouped kernel; the loop elsewhere. "triton"
    (moelab.measure.e2e.grouped_gemm) where it can run, else refused with the reason."""
    if requested not in GEMM_IMPLS:
        raise SpecError(f"gemm must be one of {', '.join(GEMM_IMPLS)}, got {requested!r}")
    if requested == "triton":
        reason = unavailable_reason(device, hidden, intermediate)
        if reason is not None:
            raise SpecError(f"gemm = triton: {reason}")
        return requested
    has_grouped = hasattr(torch, "_grouped_mm")
    if requested in ("grouped", "grouped-wide"):
        if not has_grouped:
            raise SpecError(f"gemm = {requested}: torch {torch.__version__} has no torch._grouped_mm")
        return requested
    if requested in ("loop", "padded"):
        return requested
    aligned = hidden % GEMM_ALIGN == 0 and intermediate % GEMM_ALIGN == 0
    hopper = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)
    return "grouped" if has_grouped and aligned and hopper else "loop"


def padded_index(offsets: torch.Tensor, num_pairs: int, max_group: int) -> torch.Tensor:
    """[P] int64: each expert-sorted pair's row in the padded layout [E, max_group] (expert e's j-th pair
    at e * max_group + j). No host sync: the sizes come from the grouping's one."""
    counts = torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long())
    experts = torch.arange(offsets.numel(), device=offsets.device)
    expert_of_pair = torch.repeat_interleave(experts, counts, output_size=num_pairs)
    start = (offsets.long() - counts).index_select(0, expert_of_pair)
    return expert_of_pair * max_group + (torch.arange(num_pairs, device=offsets.device) - start)


# torch._grouped_mm on SM90 picks its CUTLASS tile from the average rows per group, rows / groups
# (GroupMM.cu: `small = M <= 128 || N <= 128`): at most 128 takes the 64x128x128 ping-pong tile, above it
# the 128x256x64 cooperative one. A micro-batch of the DeepSeek-V3 shape at EP = 2 (16384 pairs over 128
# experts: 128 on average) lands on the narrow tile, whose grouped GEMM took 3.2 ms against 3.6 ms for the
# whole batch on the wide one (2 x H200, results/h200x2-r8). Whether the wide tile is faster there depends
# on the card and the spread of rows per expert (a 128-row tile wastes as much on 128 +- 11 rows): gemm =
# auto times it (on H200, before wide_tile_pad divided as torch does, it tied; the padded matmul won).
NARROW_TILE_MAX_ROWS = 128


def wide_tile_pad(rows: int, groups: int) -> int:
    """Rows to add after the last group so that torch._grouped_mm's average rows per group, an integer
    division (rows / groups in int32), exceeds NARROW_TILE_MAX_ROWS and it launches its wide tile; 0 where
    it already does (or there is nothing to compute). Rows past the last offset belong to no group: no
    tile computes them."""
    if rows == 0 or groups == 0 or rows // groups > NARROW_TILE_MAX_ROWS:
        return 0
    return (NARROW_TILE_MAX_ROWS + 1) * groups - rows


def largest_group(x: torch.Tensor, offsets: torch.Tensor, ends: Sequence[int] | None, max_group: int) -> int:
    """The largest group's rows: `max_group` where given, else from the host's ends, else read (a sync)."""
    if max_group or not x.shape[0]:
        return max_group
    bounds = list(ends) if ends is not None else offsets.tolist()
    return max(hi - lo for lo, hi in zip([0, *bounds[:-1]], bounds, strict=True))


def grouped_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    impl: str,
    ends: Sequence[int] | None = None,
    max_group: int = 0,
) -> torch.Tensor:
    """x [P, K] rows sorted by group, w [G, K, N], offsets [G] int32 cumulative row ends -> [P, N]. `ends`:
    the same offsets where the host has them (the loop then needs no host sync). `max_group`: the largest
    group's rows (the Triton kernel's grid; read here, one host sync, where not given)."""
    if impl == "grouped":
        return torch._grouped_mm(x, w, offs=offsets)
    if impl == "triton":
        return triton_grouped_mm(x, w, offsets, largest_group(x, offsets, ends, max_group))
    if ends is None:
        ends = offsets.tolist()  # host sync: the loop needs the group sizes on the host
    outs, start = [], 0
    for g, end in enumerate(ends):
        outs.append(x[start:end] @ w[g])
        start = end
    return torch.cat(outs) if outs else x.new_empty(0, w.shape[2])


def swiglu_ffn(
    x: torch.Tensor,
    offsets: torch.Tensor,
    weights: ExpertWeights,
    impl: str,
    act: str = "torch",
    max_group: int = 0,
    ends: Sequence[int] | None = None,
    deferred: DeferredWgrad | None = None,
) -> torch.Tensor:
    """The grouped GEMMs and the activation (`act`: "triton" fused, else torch's; `impl` triton fuses it
    into the first GEMM): expert-sorted rows [P, H] -> [P, H]. `ends`: the offsets on the host, where known (the loop's sizes). `deferred`: an
    overlapped forward's parts, whose weight gradient is computed once for all of them (grouped and
    padded GEMMs; moelab.measure.e2e.wgrad)."""
    w13, w2 = weights.w13, weights.w2
    if impl == "padded":
        # one batched matmul per projection over every expert padded to `max_group` rows: cuBLAS's batched
        # GEMM runs near the dense rate where the grouped kernel's tiles go short on few rows per expert;
        # the zero rows cost (E x max_group - P) / P more FLOPs (small under balanced routing), and the
        # activation runs on them too (silu(0) * 0 = 0), their outputs dropped by the final gather
        max_group = max(max_group, 1)
        index = padded_index(offsets, x.shape[0], max_group)
        experts, k = w13.shape[0], x.shape[1]
        padded = x.new_zeros(experts * max_group, k).index_copy(0, index, x).view(experts, max_group, k)
        if deferred is not None:
            padded, w13, w2 = deferred.weights(padded)
        h3 = torch.bmm(padded, w13)
        a = swiglu(h3.view(experts * max_group, -1), act).view(experts, max_group, -1)
        y = torch.bmm(a, w2)
        if deferred is not None:
            deferred.keep(padded, h3, a, y, None, 0)
        return y.view(experts * max_group, -1).index_select(0, index)
    if impl in ("grouped", "grouped-wide", "triton") and x.shape[0] == 0:
        impl = "loop"  # no pairs on this rank (skewed routing): torch's grouped backward refuses empty rows
    rows, pad = x.shape[0], 0
    if impl == "grouped-wide":
        # the grouped kernel on rows padded past torch's narrow-tile average: the pad rows ride through both
        # projections (the activation's pad rows hold whatever the first GEMM left there: no group reads
        # them) and are cut off the output; their gradients are dropped by the same cut and the concatenation
        impl, pad = "grouped", wide_tile_pad(rows, w13.shape[0])
        if pad:
            x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    if impl not in ("grouped", "triton"):
        deferred = None  # the loop: autograd's own weight gradient
    if impl == "triton" and deferred is None:
        # the first GEMM and the activation in one kernel: h is written only where backward needs it
        # (a deferred weight gradient reads h's gradient off a hook on h: the unfused path below)
        max_group = largest_group(x, offsets, ends, max_group)
        a = triton_grouped_swiglu(x, w13, offsets, max_group)
        return triton_grouped_mm(a, w2, offsets, max_group)
    if deferred is not None:
        x, w13, w2 = deferred.weights(x)
    h = grouped_matmul(x, w13, offsets, impl, ends, max_group)
    a = swiglu(h, act)
    y = grouped_matmul(a, w2, offsets, impl, ends, max_group)
    if deferred is not None:
        deferred.keep(x, h, a, y, offsets, rows)
    return y[:rows] if pad else y


@dataclass(slots=True)
class Grouped:
    """Received rows replicated per local expert and sorted by expert, and the map back to the rows."""

    x: torch.Tensor  # [P, H] bf16
    map: PairMap
    offsets: torch.Tensor  # [E] int32 cumulative pair counts

    @property
    def num_pairs(self) -> int:
        return self.map.num_pairs

    @property
    def num_rows(self) -> int:
        return self.map.num_rows

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the expert compute reads (handed over between streams)."""
        return (self.x, self.offsets, *self.map.tensors())

    def host_ends(self) -> list[int] | None:
        """The offsets on the host where the grouping was given the counts up front (the loop's sizes
        without a sync), else None."""
        counts = self.map.host_counts
        return None if counts is None else list(itertools.accumulate(counts))


@dataclass(slots=True)
class Received:
    """What the expert compute of one chunk needs: its grouped rows and the handle to send them back, and
    the rows as they arrived (payload, local expert ids, weights), from which `MoELayer.regroup` times the
    grouping on its own."""

    grouped: Grouped
    handle: Any
    arrived: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def received_payload(d: Dispatched) -> torch.Tensor:
    """The received rows as bf16 (fp8 payloads with per-128 scales dequantized)."""
    if d.recv_scales is not None or d.recv_x.dtype != torch.bfloat16:
        return d.recv_x_float().to(torch.bfloat16)
    return d.recv_x


def group_by_expert(
    recv_x: torch.Tensor,
    recv_topk_idx: torch.Tensor,
    recv_topk_weights: torch.Tensor,
    experts_per_rank: int,
    impl: str = "torch",
    counts: Sequence[int] | None = None,
) -> Grouped:
    """The permute of the received rows (`impl`: moelab.measure.e2e.permute's, resolved; `counts`: each
    local expert's pairs where known on the host, sparing pair_map its host sync)."""
    m, offsets = pair_map(recv_topk_idx, recv_topk_weights, experts_per_rank, counts)
    return Grouped(x=permute(recv_x, m, impl), map=m, offsets=offsets)


def supports_backward(backend: Backend) -> str | None:
    """None when the layer can run backward through `backend` (prepared for the case), else why not."""
    if not isinstance(backend, DispatchAlongHandle):
        return (
            f"{backend.name} has no dispatch_with_handle(rows, handle): the backward of combine needs "
            "to send output gradients along the forward dispatch's handle"
        )
    return backend.dispatch_with_handle_reason() if isinstance(backend, HandleDispatchReason) else None


def has_phases(backend: Backend) -> bool:
    """The backend splits the layout step from the payload dispatch (the lead's Backend.phases)."""
    return backend.phases


def backend_dispatch(
    backend: Backend, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any
) -> Dispatched:
    if layout is None:
        return backend.dispatch(x, topk_idx, topk_weights)
    return backend.dispatch(x, topk_idx, topk_weights, layout=layout)  # type: ignore[call-arg]


def own_output(t: torch.Tensor) -> torch.Tensor:
    """A Function's output as a tensor object of its own (an alias: no copy). Autograd sets the grad_fn on
    the very object forward returns, and a backend may keep that object: nccl-a2a's receive rows live on in
    its handle's views, and ctx holds the handle. That cycle runs through autograd's C++ graph, where
    Python's collector cannot see it, so the graph, the backend and its process group lived until the
    interpreter exited (moelab.measure.teardown)."""
    return t.view_as(t)


class _DispatchFn(torch.autograd.Function):
    """recv_x = dispatch(x); backward: combine of the received rows' gradients (summed at the source)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        backend: Backend,
        layout: Any,
        out: list[Dispatched],
    ) -> torch.Tensor:  # type: ignore[override]
        d = backend_dispatch(backend, x, topk_idx, topk_weights, layout)
        out.append(d)
        ctx.backend, ctx.handle = backend, d.handle
        return own_output(received_payload(d))

    @staticmethod
    def backward(ctx: Any, grad_recv: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad_x = ctx.backend.combine(grad_recv.to(torch.bfloat16).contiguous(), ctx.handle)
        return grad_x, None, None, None, None, None


class _HookedDispatchFn(torch.autograd.Function):
    """recv_x = the receive hook of a dispatch of x already sent; backward as _DispatchFn's."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, hook: Callable[[], Dispatched], backend: Backend, out: list[Dispatched]
    ) -> torch.Tensor:  # type: ignore[override]
        d = hook()
        out.append(d)
        ctx.backend, ctx.handle = backend, d.handle
        return own_output(received_payload(d))

    @staticmethod
    def backward(ctx: Any, grad_recv: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad_x = ctx.backend.combine(grad_recv.to(torch.bfloat16).contiguous(), ctx.handle)
        return grad_x, None, None, None


@dataclass(slots=True)
class Sent:
    """A dispatch whose send is launched and whose receive is a hook (RecvHook)."""

    x: torch.Tensor
    hook: Callable[[], Dispatched]


class _CombineFn(torch.autograd.Function):
    """out = combine(expert_out); backward: the output gradient dispatched along the same handle."""

    @staticmethod
    def forward(ctx: Any, expert_out: torch.Tensor, handle: Any, backend: Backend) -> torch.Tensor:  # type: ignore[override]
        ctx.backend, ctx.handle = backend, handle
        return own_output(backend.combine(expert_out, handle))

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad = ctx.backend.dispatch_with_handle(grad_out.to(torch.bfloat16).contiguous(), ctx.handle)
        return grad, None, None


class MoELayer:
    """The three steps of the layer on one rank; serial and overlapped schedules compose them.

    Autograd Functions wrap dispatch and combine when gradients are being recorded (grad mode on and
    the input requires grad); otherwise the backend is called directly.
    """

    def __init__(
        self,
        backend: Backend,
        weights: ExpertWeights,
        experts_per_rank: int,
        gemm: str,
        permute: str = "torch",
    ) -> None:
        self.backend = backend
        self.weights = weights
        self.experts_per_rank = experts_per_rank
        self.gemm = gemm
        # the GEMM an overlapped schedule's parts run, where chosen apart from the whole batch's (gemm =
        # auto: a part has fewer rows per expert, where another implementation may be the fastest)
        self.part_gemm: str | None = None
        self.permute = permute  # resolved by moelab.measure.e2e.permute; triton fuses SwiGLU too
        # the weight gradient of the overlapped forward under way, computed once for its parts (deferring)
        self.deferred: DeferredWgrad | None = None
        self.wgrad_how = ""  # how the last deferred weight gradient was computed (merged / per part)

    @contextlib.contextmanager
    def parts(self) -> Iterator[None]:
        """Expert compute inside runs the parts' GEMM (`part_gemm`, where chosen): around an overlapped
        schedule's forward; its backward follows the ops the forward recorded."""
        if self.part_gemm is None:
            yield
            return
        whole, self.gemm = self.gemm, self.part_gemm
        try:
            yield
        finally:
            self.gemm = whole

    @contextlib.contextmanager
    def deferring(self, parts: int) -> Iterator[DeferredWgrad | None]:
        """Around an overlapped schedule's forward of `parts` parts: where autograd records it (the weights
        take gradients) and the parts' GEMM is grouped or padded, their weight gradient is computed once,
        after the last part's backward (moelab.measure.e2e.wgrad)."""
        impl = "grouped" if self.gemm in ("grouped-wide", "triton") else self.gemm  # the same rows in groups
        w = self.weights
        if parts < 2 or impl not in DEFERRED_IMPLS or not (torch.is_grad_enabled() and w.w13.requires_grad):
            yield None
            return
        self.deferred = DeferredWgrad(w13=w.w13, w2=w.w2, impl=impl, on_done=self._wgrad_done)
        try:
            yield self.deferred
        finally:
            self.deferred = None

    def _wgrad_done(self, how: str) -> None:
        self.wgrad_how = how

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        """The backend's layout of this routing (None when the backend has no layout step of its own)."""
        if not has_phases(self.backend):
            return None
        return self.backend.layout(topk_idx, topk_weights)  # type: ignore[attr-defined]

    def _batched_layouts(self, routings: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> PartLayouts | None:
        """Every routing's layout and pair counts from the backend's one read (BatchedLayout), or None where
        it has none for the prepared case."""
        if has_phases(self.backend) and isinstance(self.backend, BatchedLayout):
            return self.backend.layouts(routings)
        return None

    def part_layouts(
        self, routings: Sequence[tuple[torch.Tensor, torch.Tensor]], host_counts: bool = True
    ) -> tuple[list[Any], list[tuple[int, ...] | None]]:
        """Each part's layout (None where the backend has no layout step) and, with `host_counts`, each
        part's pair counts on the host, before any payload, with the fewest host syncs the backend allows:
        one count exchange and one read for every part (BatchedLayout); none of our own where the fresh
        dispatch reads the counts in its own sync (HostExpertCounts: the counts are None here and come
        with each dispatch); else the pair-count all-reduce, launched ahead of the layouts and read after
        them (moelab.measure.e2e.pair_counts)."""
        unread: list[tuple[int, ...] | None] = [None] * len(routings)
        batched = self._batched_layouts(routings) if host_counts else None
        if batched is not None:
            return list(batched.handles), list(batched.pair_counts)
        if not host_counts or (
            isinstance(self.backend, HostExpertCounts) and self.backend.expert_counts_on_host()
        ):
            return [self.layout(i, w) for i, w in routings], unread
        pending = start_pair_counts(self.backend, [i for i, _ in routings], self.experts_per_rank)
        layouts = [self.layout(i, w) for i, w in routings]
        return layouts, list(pending.result())

    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        layout: Any = None,
        counts: Sequence[int] | None = None,
    ) -> Received:
        """`counts`: each local expert's pair count, read up front (moelab.measure.e2e.pair_counts): the
        grouping then needs no host sync."""
        if torch.is_grad_enabled() and x.requires_grad:
            got: list[Dispatched] = []
            recv_x = _DispatchFn.apply(x, topk_idx, topk_weights, self.backend, layout, got)
            d = got[0]
        else:
            d = backend_dispatch(self.backend, x, topk_idx, topk_weights, layout)
            recv_x = received_payload(d)
        return self._grouped(recv_x, d, counts)

    def _grouped(self, recv_x: torch.Tensor, d: Dispatched, counts: Sequence[int] | None = None) -> Received:
        if counts is None:  # the library's, read in its own sync where it does (HostExpertCounts)
            counts = d.recv_expert_counts
        grouped = group_by_expert(
            recv_x, d.recv_topk_idx, d.recv_topk_weights, self.experts_per_rank, self.permute, counts
        )
        return Received(
            grouped=grouped,
            handle=d.handle,
            arrived=(recv_x, d.recv_topk_idx, d.recv_topk_weights),
        )

    def regroup(self, received: Received) -> Grouped:
        """The grouping (pair map and permute) of rows that arrived, again: the `permute` op times it."""
        assert received.arrived is not None, "a Received made by MoELayer.dispatch keeps its arrived rows"
        recv_x, recv_topk_idx, recv_topk_weights = received.arrived
        counts = received.grouped.map.host_counts  # the counts the first grouping was given, if any
        return group_by_expert(
            recv_x, recv_topk_idx, recv_topk_weights, self.experts_per_rank, self.permute, counts
        )

    def send(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Sent:
        """The first half of a hooked dispatch (the backend has RecvHook): the send, launched now."""
        assert isinstance(self.backend, RecvHook)
        return Sent(x=x, hook=self.backend.dispatch_hooked(x, topk_idx, topk_weights))

    def receive(self, sent: Sent, counts: Sequence[int] | None = None) -> Received:
        """The second half: the receive hook, then the grouping, as dispatch does."""
        if torch.is_grad_enabled() and sent.x.requires_grad:
            got: list[Dispatched] = []
            recv_x = _HookedDispatchFn.apply(sent.x, sent.hook, self.backend, got)
            d = got[0]
        else:
            d = sent.hook()
            recv_x = received_payload(d)
        return self._grouped(recv_x, d, counts)

    def experts(self, received: Received) -> torch.Tensor:
        """Expert compute: the SwiGLU FFN of every pair, weighted and summed per received row: [R, H]."""
        g = received.grouped
        return unpermute(self.ffn(g), g.map, self.permute)

    def ffn(self, g: Grouped) -> torch.Tensor:
        """The grouped GEMMs and activation of already-grouped rows: [P, H]."""
        ends = g.host_ends()
        deferred = self.deferred if g.num_pairs else None  # a part with no rows: autograd's own (zero)
        return swiglu_ffn(
            g.x, g.offsets, self.weights, self.gemm, self.permute, g.map.max_group, ends, deferred
        )

    def combine(self, expert_out: torch.Tensor, received: Received) -> torch.Tensor:
        if torch.is_grad_enabled() and expert_out.requires_grad:
            return _CombineFn.apply(expert_out, received.handle, self.backend)  # type: ignore[no-any-return]
        return self.backend.combine(expert_out, received.handle)

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The serial layer: dispatch, expert compute, combine, one after the other. Where the backend lays
        out with its pair counts in one read (BatchedLayout), the layout goes first and the grouping needs
        no read of its own: one host sync for the layer, as the overlapped schedules have."""
        layout, counts = None, None
        batched = self._batched_layouts([(topk_idx, topk_weights)])
        if batched is not None:
            layout, counts = batched.handles[0], batched.pair_counts[0]
        received = self.dispatch(x, topk_idx, topk_weights, layout=layout, counts=counts)
        return self.combine(self.experts(received), received)
