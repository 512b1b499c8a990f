"""Token → expert routing, deterministic in (seed, rank, world) so every rank can rebuild any rank's routing.

Generated on the CPU with a private torch.Generator (bit-identical on every machine), then moved.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from moelab.core.workload import Workload


@dataclass(frozen=True, slots=True)
class Routing:
    """One rank's routing: topk_idx [T, K] int64 global expert ids (distinct per token), topk_weights [T, K] float32."""

    topk_idx: torch.Tensor
    topk_weights: torch.Tensor

    def to(self, device: torch.device | str) -> Routing:
        return Routing(self.topk_idx.to(device), self.topk_weights.to(device))


def _generator(*parts: object) -> torch.Generator:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def expert_popularity_order(workload: Workload, world: int) -> torch.Tensor:
    """A permutation of experts shared by all ranks: position 0 is the most popular (zipf) or hottest (hot)."""
    gen = _generator("popularity", workload.routing.seed, world)
    return torch.randperm(workload.num_experts(world), generator=gen)


def route(workload: Workload, rank: int, world: int) -> Routing:
    """Routing for `rank` of `world`; the same on every call and on every machine."""
    workload.validate(world)
    spec = workload.routing
    num_tokens, topk, num_experts = workload.tokens_per_rank, workload.topk, workload.num_experts(world)
    gen = _generator("route", spec.kind, spec.seed, rank, world)

    if spec.kind == "uniform":
        scores = torch.rand(num_tokens, num_experts, generator=gen)
        topk_idx = scores.topk(topk, dim=1).indices
    elif spec.kind == "zipf":
        order = expert_popularity_order(workload, world)
        probs_by_popularity = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float64) ** spec.zipf_s
        probs = torch.empty(num_experts, dtype=torch.float64)
        probs[order] = probs_by_popularity
        probs = (probs / probs.sum()).expand(num_tokens, num_experts)
        topk_idx = torch.multinomial(probs, topk, replacement=False, generator=gen)
    elif spec.kind == "grouped":
        topk_idx = _grouped_topk(torch.rand(num_tokens, num_experts, generator=gen), workload, world)
    else:  # hot
        order = expert_popularity_order(workload, world)
        hot = order[: spec.hot_experts]
        scores = torch.rand(num_tokens, num_experts, generator=gen)
        is_hot_token = torch.rand(num_tokens, generator=gen) < spec.hot_share
        pick = hot[torch.randint(len(hot), (num_tokens,), generator=gen)]
        rows = torch.nonzero(is_hot_token).squeeze(1)
        scores[rows, pick[rows]] = 2.0  # above any uniform score: guaranteed first choice
        topk_idx = scores.topk(topk, dim=1).indices

    raw = torch.rand(num_tokens, topk, generator=gen, dtype=torch.float32) + 0.1
    topk_weights = raw / raw.sum(dim=1, keepdim=True)
    return Routing(topk_idx.to(torch.int64).contiguous(), topk_weights.contiguous())


def _grouped_topk(scores: torch.Tensor, workload: Workload, world: int) -> torch.Tensor:
    """DeepEP tests/test_internode.py (v1.2.1): a group's score is its best expert's; the token keeps its
    best groups and takes its topk experts among theirs (the other groups' scores masked below any score)."""
    spec = workload.routing
    groups = spec.groups(world)
    group_best = scores.view(scores.shape[0], groups, -1).amax(dim=2)
    chosen = group_best.topk(spec.groups_per_token(world), dim=1).indices
    keep = torch.zeros(scores.shape[0], groups, dtype=torch.bool)
    keep.scatter_(1, chosen, True)
    keep = keep.repeat_interleave(scores.shape[1] // groups, dim=1)
    return scores.masked_fill(~keep, -1.0).topk(workload.topk, dim=1).indices


def route_all(workload: Workload, world: int) -> list[Routing]:
    return [route(workload, r, world) for r in range(world)]
