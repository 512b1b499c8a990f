"""Permute and un-permute of the e2e layer, in the shape production MoE layers use, deterministic forward
and backward (no atomics).

- permute: received rows [R, H] -> (row, local expert) pairs sorted by expert [P, H]: a row gather.
- un-permute: pairs [P, H] -> rows [R, H]: each row's slots gathered back in token order and summed with
  their routing weights, in float32, rounded to the activation dtype once (torchtitan's permute indices
  with a batched weighted sum; Megatron-Core's fused un-permute). The weights are applied here, not
  multiplied into the pairs beforehand.

Each is the other's backward: the gradient of permute is an un-permute with unit weights (a row's pairs
summed), the gradient of un-permute w.r.t. the pairs is a gather of the row gradients scaled by each
pair's weight. Routing weights get no gradient (inputs, not parameters; see moelab.measure.e2e.layer).
The old path (`index_add` of weighted pairs: bf16 atomics on CUDA, whose sum order varies run to run)
stays as implementation "index_add", for comparison in tests and benchmarks/e2e_layer_gpu.py.

Implementations: "triton" (moelab.measure.e2e.triton_kernels: one program per row, each byte read and
written once), "torch" (index_select, and a float32 loop over the K slots), "index_add" (the old path);
"auto" is triton on CUDA where triton is installed, else torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from moelab.core.errors import SpecError
from moelab.measure.e2e import triton_kernels

PERMUTE_IMPLS = ("auto", "triton", "torch", "index_add")


@dataclass(frozen=True, slots=True)
class PairMap:
    """Where each (row, slot) of the received routing went among the expert-sorted pairs, and back."""

    pair_slot: torch.Tensor  # [P] int64: the flat slot (row * K + k) of each pair, sorted by expert
    pair_row: torch.Tensor  # [P] int64: the received row of each pair (pair_slot // K)
    slot_pair: torch.Tensor  # [R, K] int64: each slot's pair, -1 where its expert is on another rank
    slot_weight: torch.Tensor  # [R, K] float32: each slot's routing weight, 0 where not local
    max_group: int = 0  # the most pairs any one expert got (read in the same host sync as the pair count)
    host_counts: tuple[int, ...] | None = None  # each local expert's pairs, where the host knew them up front

    @property
    def num_pairs(self) -> int:
        return int(self.pair_slot.numel())

    @property
    def num_rows(self) -> int:
        return int(self.slot_pair.shape[0])

    def pair_weight(self) -> torch.Tensor:
        """[P] float32: each pair's routing weight."""
        return self.slot_weight.reshape(-1).index_select(0, self.pair_slot)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.pair_slot, self.pair_row, self.slot_pair, self.slot_weight


def pair_map(
    recv_topk_idx: torch.Tensor,
    recv_topk_weights: torch.Tensor,
    experts_per_rank: int,
    counts: Sequence[int] | None = None,
) -> tuple[PairMap, torch.Tensor]:
    """The pair map of the received routing ([R, K] local expert ids, -1 elsewhere) and the grouped GEMM's
    offsets ([E] int32 cumulative pair counts). The pair count sizes the pairs: with `counts` (each local
    expert's pairs, known on the host before the payload: moelab.measure.e2e.pair_counts) no host sync,
    else one, which stalls the host until the dispatch has landed. Either way the same tensors."""
    num_rows, topk = recv_topk_idx.shape
    idx = recv_topk_idx.reshape(-1).to(torch.int64)
    valid = (idx >= 0) & (idx < experts_per_rank)
    key = torch.where(valid, idx, experts_per_rank)  # slots of other ranks' experts sort last
    # a stable radix sort costs a pass per key byte: int16 keys (any expert count a rank holds) take 2, not 8
    narrow = key.to(torch.int16) if experts_per_rank < torch.iinfo(torch.int16).max else key
    sorted_keys, order = torch.sort(narrow, stable=True)
    # each expert's cumulative pair count, where its keys end among the sorted ones: no host sync (CUDA's
    # torch.bincount reads the input's min and max on the host to size its output, two syncs)
    experts = torch.arange(experts_per_rank, dtype=sorted_keys.dtype, device=idx.device)
    offsets = torch.searchsorted(sorted_keys, experts, right=True, out_int32=True)
    host: tuple[int, ...] | None = None
    if counts is not None:
        host = tuple(int(c) for c in counts)
        if len(host) != experts_per_rank:
            raise ValueError(f"pair counts for {len(host)} experts, the rank holds {experts_per_rank}")
        num_pairs, max_group = sum(host), max(host, default=0)
    elif experts_per_rank:
        # one host sync: the pair count sizes the gather, the largest group the padded GEMM
        device_counts = torch.diff(offsets, prepend=offsets.new_zeros(1))
        both = torch.stack([offsets[-1], device_counts.max()]).tolist()
        num_pairs, max_group = int(both[0]), int(both[1])
    else:
        num_pairs, max_group = 0, 0
    pair_slot = order[:num_pairs]
    slot_pair = torch.full((num_rows * topk,), -1, dtype=torch.int64, device=idx.device)
    slot_pair.scatter_(0, pair_slot, torch.arange(num_pairs, device=idx.device))  # distinct slots: no race
    weight = torch.where(valid, recv_topk_weights.reshape(-1).to(torch.float32), 0.0)
    m = PairMap(
        pair_slot=pair_slot,
        pair_row=torch.div(pair_slot, topk, rounding_mode="floor"),
        slot_pair=slot_pair.view(num_rows, topk),
        slot_weight=weight.view(num_rows, topk),
        max_group=max_group,
        host_counts=host,
    )
    return m, offsets


def resolve_permute(requested: str, device: torch.device) -> str:
    """The implementation `requested` runs as on `device`; SpecError for one that cannot run there."""
    if requested not in PERMUTE_IMPLS:
        raise SpecError(f"permute must be one of {', '.join(PERMUTE_IMPLS)}, got {requested!r}")
    probe = torch.empty(0, device=device)
    reason = triton_kernels.unavailable_reason(probe)
    if requested == "auto":
        return "torch" if reason else "triton"
    if requested == "triton" and reason:
        raise SpecError(f"permute = triton: {reason}")
    return requested


# --- the torch implementations (and the old index_add path) ---


def _slot_sum_torch(y: torch.Tensor, m: PairMap, weighted: bool) -> torch.Tensor:
    """Each row's slots' pairs summed in float32 (weighted or not), slot after slot: deterministic."""
    acc = torch.zeros(m.num_rows, y.shape[1], dtype=torch.float32, device=y.device)
    if m.num_pairs == 0:
        return acc.to(y.dtype)
    present = m.slot_pair >= 0
    scale = torch.where(present, m.slot_weight, 0.0) if weighted else present.to(torch.float32)
    gather = m.slot_pair.clamp(min=0)
    for k in range(m.slot_pair.shape[1]):
        acc.addcmul_(y.index_select(0, gather[:, k]), scale[:, k : k + 1])  # float32 arithmetic
    return acc.to(y.dtype)


def _index_add(y: torch.Tensor, m: PairMap) -> torch.Tensor:
    """The old path: each pair times its weight (in y's dtype), index_add into its row."""
    out = torch.zeros(m.num_rows, y.shape[1], dtype=y.dtype, device=y.device)
    return out.index_add(0, m.pair_row, y * m.pair_weight().to(y.dtype).unsqueeze(1))


def _gather(x: torch.Tensor, index: torch.Tensor, scale: torch.Tensor | None, impl: str) -> torch.Tensor:
    if impl == "triton":
        return triton_kernels.gather_rows(x, index, scale)
    rows = x.index_select(0, index)
    if scale is None:
        return rows
    return (rows.to(torch.float32) * scale.unsqueeze(1)).to(x.dtype)


def _slot_sum(y: torch.Tensor, m: PairMap, weighted: bool, impl: str) -> torch.Tensor:
    if impl == "triton":
        return triton_kernels.slot_sum(y, m.slot_pair, m.slot_weight if weighted else None)
    if impl == "index_add":
        if weighted:
            return _index_add(y, m)
        out = torch.zeros(m.num_rows, y.shape[1], dtype=y.dtype, device=y.device)
        return out.index_add(0, m.pair_row, y)
    return _slot_sum_torch(y, m, weighted)


# --- autograd ---


class _PermuteFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, m: PairMap, impl: str) -> torch.Tensor:  # type: ignore[override]
        ctx.m, ctx.impl = m, impl
        return _gather(x, m.pair_row, None, impl)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _slot_sum(grad.contiguous(), ctx.m, False, ctx.impl), None, None


class _UnpermuteFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, m: PairMap, impl: str) -> torch.Tensor:  # type: ignore[override]
        ctx.m, ctx.impl = m, impl
        return _slot_sum(y, m, True, impl)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return unpermute_grad(grad, ctx.m, ctx.impl), None, None


def unpermute_grad(grad: torch.Tensor, m: PairMap, impl: str) -> torch.Tensor:
    """The un-permute's backward: [R, H] row gradients -> [P, H] pair gradients, each its row's scaled by
    the pair's routing weight (a schedule that runs its own backward calls it directly)."""
    return _gather(grad.contiguous(), m.pair_row, m.pair_weight(), impl)


def permute(x: torch.Tensor, m: PairMap, impl: str) -> torch.Tensor:
    """[R, H] received rows -> [P, H] expert-sorted pairs (`impl` resolved: triton, torch or index_add)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _PermuteFn.apply(x, m, impl)  # type: ignore[no-any-return]
    return _gather(x, m.pair_row, None, impl)


def unpermute(y: torch.Tensor, m: PairMap, impl: str) -> torch.Tensor:
    """[P, H] pair outputs -> [R, H]: each row's pairs weighted by their routing weights and summed."""
    if torch.is_grad_enabled() and y.requires_grad:
        return _UnpermuteFn.apply(y, m, impl)  # type: ignore[no-any-return]
    return _slot_sum(y, m, True, impl)
