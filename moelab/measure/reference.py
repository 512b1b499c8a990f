"""Reference semantics of dispatch and combine in plain torch; every backend is checked against them.

dispatch: rank d receives, once, every token that has at least one of its topk experts on d (the token's
own rank included), with the token's topk ids translated to d's local expert ids (-1 where the expert
lives elsewhere) and its weights. Order is backend-specific, so the check identifies rows by content:
the first IDENTITY_COLS columns of every token encode (source rank, token index) in base-8 digits,
which survive bf16, DeepEP's fp8 (per-128 scales) and MXFP8 (per-32 scales) exactly because the first
block's amax is exactly 7.

combine: each rank applies its local experts to what it received (here a fixed per-expert scale,
weighted by the routing weights, summed over its local experts), sends one row back per received token,
and the source sums the rows from all ranks: out[t] = sum_k w[t,k] * scale(e[t,k]) * x[t].
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch

from moelab.core.routing import Routing
from moelab.core.workload import Workload

RANK_DIGITS = 3
TOKEN_DIGITS = 7
IDENTITY_COLS = RANK_DIGITS + TOKEN_DIGITS
IDENTITY_BLOCK = 128  # covers DeepEP's fp8 scale block (128) and MXFP8's (32)
MIN_HIDDEN = 16
MAX_RANKS = 8**RANK_DIGITS
MAX_TOKENS = 8**TOKEN_DIGITS

# Tolerances of ||out - ref|| / ||ref|| per payload type, from the payload's rounding.
DISPATCH_TOL = {"bf16": 0.0, "fp8": 0.07, "mxfp8": 0.07}
COMBINE_TOL = {"bf16": 0.02, "mxfp8": 0.08}


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") & (
        (1 << 63) - 1
    )


def make_tokens(workload: Workload, rank: int) -> torch.Tensor:
    """Deterministic bf16 tokens [T, H] on the CPU, identity-encoded in the first block (a fresh copy: the
    cases of a job that differ only in SMs or knobs share the generated tokens, not the tensor)."""
    return _tokens(workload.tokens_per_rank, workload.hidden, workload.routing.seed, rank).clone()


@functools.lru_cache(maxsize=16)
def _tokens(num_tokens: int, hidden: int, seed: int, rank: int) -> torch.Tensor:
    """Generating them costs a fraction of a second at the reference size, per rank and case."""
    gen = torch.Generator().manual_seed(_seed("tokens", seed, rank, hidden))
    x = torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float32)
    block = min(IDENTITY_BLOCK, hidden)
    x[:, :block] = 7.0
    x[:, :IDENTITY_COLS] = _encode_identity(rank, num_tokens)
    return x.to(torch.bfloat16)


def _encode_identity(rank: int, num_tokens: int) -> torch.Tensor:
    tokens = torch.arange(num_tokens, dtype=torch.int64)
    cols = [torch.full((num_tokens,), (rank // 8**i) % 8, dtype=torch.int64) for i in range(RANK_DIGITS)]
    cols += [(tokens // 8**i) % 8 for i in range(TOKEN_DIGITS)]
    return torch.stack(cols, dim=1).to(torch.float32)


def decode_identity(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(source rank, token index, all digits were exact integers in 0..7) of received rows."""
    digits = rows[:, :IDENTITY_COLS].float().cpu()
    rounded = digits.round()
    exact = bool(((digits - rounded).abs() < 1e-3).all() and ((rounded >= 0) & (rounded <= 7)).all())
    d = rounded.to(torch.int64).clamp(0, 7)
    weights_rank = torch.tensor([8**i for i in range(RANK_DIGITS)], dtype=torch.int64)
    weights_tok = torch.tensor([8**i for i in range(TOKEN_DIGITS)], dtype=torch.int64)
    return (d[:, :RANK_DIGITS] * weights_rank).sum(1), (d[:, RANK_DIGITS:] * weights_tok).sum(1), exact


def expert_scale(global_expert: torch.Tensor) -> torch.Tensor:
    """The stand-in expert function: a fixed scale per expert, a power-of-two fraction (exact in bf16)."""
    return 1.0 + (global_expert % 4).to(torch.float32) * 0.25


@dataclass(frozen=True, slots=True)
class ExpectedDispatch:
    """What rank `dest` must receive, ordered by (source rank, token index)."""

    src_rank: torch.Tensor  # [R]
    src_token: torch.Tensor  # [R]
    topk_idx_local: torch.Tensor  # [R, K], -1 where the expert is not on dest
    topk_weights: torch.Tensor  # [R, K], 0 where the expert is not on dest

    @property
    def num_rows(self) -> int:
        return int(self.src_rank.numel())


def reference_dispatch(routings: list[Routing], dest: int, experts_per_rank: int) -> ExpectedDispatch:
    ranks, tokens, idx, weights = [], [], [], []
    for src, r in enumerate(routings):
        topk_idx = r.topk_idx.cpu()
        on_dest = (topk_idx // experts_per_rank) == dest
        rows = torch.nonzero(on_dest.any(dim=1)).squeeze(1)
        local = torch.where(
            on_dest[rows], topk_idx[rows] - dest * experts_per_rank, torch.full_like(topk_idx[rows], -1)
        )
        w = torch.where(
            on_dest[rows], r.topk_weights.cpu()[rows], torch.zeros_like(r.topk_weights.cpu()[rows])
        )
        ranks.append(torch.full_like(rows, src))
        tokens.append(rows)
        idx.append(local)
        weights.append(w)
    return ExpectedDispatch(torch.cat(ranks), torch.cat(tokens), torch.cat(idx), torch.cat(weights))


def expert_output(
    x_rows: torch.Tensor,
    topk_idx_local: torch.Tensor,
    topk_weights: torch.Tensor,
    rank: int,
    experts_per_rank: int,
) -> torch.Tensor:
    """What rank `rank`'s local experts return for received rows: sum over local experts of w * scale * x, in bf16."""
    valid = topk_idx_local >= 0
    global_ids = torch.where(
        valid, topk_idx_local + rank * experts_per_rank, torch.zeros_like(topk_idx_local)
    )
    coef = (topk_weights.float() * expert_scale(global_ids) * valid).sum(dim=1, keepdim=True)
    return (x_rows.float() * coef).to(torch.bfloat16)


def reference_combine(x: torch.Tensor, routing: Routing) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * scale(e[t,k]) * x[t], in float32."""
    coef = (routing.topk_weights.float().cpu() * expert_scale(routing.topk_idx.cpu())).sum(
        dim=1, keepdim=True
    )
    return x.float().cpu() * coef


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64, on `out`'s device (the GPU's, for received rows: seconds of CPU
    time per case at the reference size otherwise)."""
    out64, ref64 = out.double(), ref.to(out.device).double()
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    return num / denom if denom > 0 else num
