"""Workload validation (one-line errors that say what works) and routing invariants: deterministic in
(seed, rank, world), distinct experts per token, normalised weights, and the skew each kind promises."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.errors import SpecError
from moelab.core.routing import expert_popularity_order, route, route_all
from moelab.core.workload import PAYLOAD_DTYPES, ROUTING_KINDS, RoutingSpec, Workload


def _error(wl: Workload, world: int | None) -> str:
    with pytest.raises(SpecError) as info:
        wl.validate(world)
    msg = str(info.value)
    assert "\n" not in msg and msg
    return msg


def test_topk_above_total_experts_names_what_works() -> None:
    msg = _error(Workload(topk=8, experts_per_rank=1), world=2)
    assert "topk 8 > total experts 2" in msg
    assert "--experts-per-rank >= 4" in msg and ">= 8 ranks" in msg


@settings(max_examples=60, deadline=None)
@given(
    topk=st.integers(2, 64),
    experts_per_rank=st.integers(1, 16),
    world=st.integers(1, 16),
)
def test_topk_suggestions_are_the_smallest_that_work(topk: int, experts_per_rank: int, world: int) -> None:
    wl = Workload(topk=topk, experts_per_rank=experts_per_rank, tokens_per_rank=4, hidden=128)
    if topk <= experts_per_rank * world:
        wl.validate(world)
        return
    msg = _error(wl, world)
    m = re.search(r"--experts-per-rank >= (\d+) or >= (\d+) ranks", msg)
    assert m, msg
    min_epr, min_world = int(m.group(1)), int(m.group(2))
    Workload(topk=topk, experts_per_rank=min_epr).validate(world)
    Workload(topk=topk, experts_per_rank=experts_per_rank).validate(min_world)
    if min_epr > 1:
        with pytest.raises(SpecError):
            Workload(topk=topk, experts_per_rank=min_epr - 1).validate(world)
    if min_world > 1:
        with pytest.raises(SpecError):
            Workload(topk=topk, experts_per_rank=experts_per_rank).validate(min_world - 1)


@pytest.mark.parametrize("name", ["hidden", "tokens_per_rank", "topk", "experts_per_rank"])
@pytest.mark.parametrize("value", [0, -3, True, 2.5])
def test_sizes_must_be_positive_integers(name: str, value: object) -> None:
    msg = _error(Workload(**{name: value}), world=None)  # type: ignore[arg-type]
    assert msg.startswith(f"{name.replace('_', '-')} must be a positive integer")


def test_unknown_routing_and_dtype() -> None:
    msg = _error(Workload(routing=RoutingSpec(kind="zipfian")), world=2)
    assert "unknown routing 'zipfian'" in msg and all(k in msg for k in ROUTING_KINDS)
    msg = _error(Workload(dtype="fp16"), world=2)
    assert "unknown payload dtype 'fp16'" in msg and all(d in msg for d in PAYLOAD_DTYPES)


@pytest.mark.parametrize(
    ("routing", "needle"),
    [
        (RoutingSpec(kind="zipf", zipf_s=0.0), "zipf skew must be > 0"),
        (RoutingSpec(kind="hot", hot_experts=0), "hot_experts must be >= 1"),
        (RoutingSpec(kind="hot", hot_share=1.5), "hot_share must be within [0, 1]"),
        (RoutingSpec(kind="hot", hot_experts=99), "hot_experts 99 > total experts 16"),
    ],
)
def test_routing_parameters_validated(routing: RoutingSpec, needle: str) -> None:
    assert needle in _error(Workload(routing=routing, experts_per_rank=8), world=2)


def test_world_must_be_positive() -> None:
    assert "world size must be >= 1" in _error(Workload(topk=1), world=0)


def test_route_refuses_an_invalid_workload() -> None:
    with pytest.raises(SpecError):
        route(Workload(topk=8, experts_per_rank=1), rank=0, world=2)


def _wl(kind: str, seed: int, tokens: int, topk: int, epr: int) -> Workload:
    return Workload(
        hidden=128,
        tokens_per_rank=tokens,
        topk=topk,
        experts_per_rank=epr,
        # grouped: one rank per group, as few groups per token as hold topk experts (the tightest limit)
        routing=RoutingSpec(
            kind=kind, seed=seed, hot_experts=1, hot_share=0.5, group_ranks=1, topk_groups=-(-topk // epr)
        ),
    )


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(ROUTING_KINDS),
    seed=st.integers(0, 2**31 - 1),  # the store keeps seeds as INTEGER
    world=st.integers(1, 6),
    epr=st.integers(1, 6),
    tokens=st.integers(1, 64),
    data=st.data(),
)
def test_routing_invariants(
    kind: str, seed: int, world: int, epr: int, tokens: int, data: st.DataObject
) -> None:
    topk = data.draw(st.integers(1, epr * world))
    rank = data.draw(st.integers(0, world - 1))
    wl = _wl(kind, seed, tokens, topk, epr)
    r = route(wl, rank, world)
    assert r.topk_idx.shape == (tokens, topk) and r.topk_idx.dtype == torch.int64
    assert r.topk_weights.shape == (tokens, topk) and r.topk_weights.dtype == torch.float32
    idx = r.topk_idx
    assert int(idx.min()) >= 0 and int(idx.max()) < epr * world
    sorted_idx = idx.sort(dim=1).values
    assert bool((sorted_idx[:, 1:] != sorted_idx[:, :-1]).all()), "an expert repeats within a token"
    assert bool((r.topk_weights > 0).all())
    torch.testing.assert_close(r.topk_weights.sum(dim=1), torch.ones(tokens), rtol=0, atol=1e-5)
    again = route(wl, rank, world)
    assert torch.equal(again.topk_idx, r.topk_idx) and torch.equal(again.topk_weights, r.topk_weights)


@pytest.mark.parametrize("kind", ROUTING_KINDS)
def test_routing_depends_on_seed_rank_and_world(kind: str) -> None:
    base = route(_wl(kind, 1, 256, 4, 4), rank=0, world=4)
    assert not torch.equal(route(_wl(kind, 2, 256, 4, 4), rank=0, world=4).topk_idx, base.topk_idx)
    assert not torch.equal(route(_wl(kind, 1, 256, 4, 4), rank=1, world=4).topk_idx, base.topk_idx)
    assert not torch.equal(route(_wl(kind, 1, 256, 4, 4), rank=0, world=3).topk_idx, base.topk_idx)
    assert [torch.equal(a.topk_idx, b.topk_idx) for a, b in zip(
        route_all(_wl(kind, 1, 64, 4, 4), 4), route_all(_wl(kind, 1, 64, 4, 4), 4), strict=True
    )] == [True] * 4  # fmt: skip


def _expert_counts(wl: Workload, world: int) -> torch.Tensor:
    idx = torch.cat([r.topk_idx.flatten() for r in route_all(wl, world)])
    return torch.bincount(idx, minlength=wl.num_experts(world))


def test_zipf_skews_towards_the_popular_experts() -> None:
    world = 2
    wl = Workload(
        hidden=128,
        tokens_per_rank=4096,
        topk=2,
        experts_per_rank=8,
        routing=RoutingSpec(kind="zipf", zipf_s=1.2),
    )
    counts = _expert_counts(wl, world)
    order = expert_popularity_order(wl, world)
    by_popularity = counts[order].double()
    assert by_popularity[0] > 3 * by_popularity[-1]
    assert int(counts.argmax()) == int(order[0])
    # popularity rank and token count agree closely (Spearman over 16 experts)
    ranks = by_popularity.argsort(descending=True).argsort().double()
    spearman = 1 - 6 * float(((ranks - torch.arange(16.0)) ** 2).sum()) / (16 * (16**2 - 1))
    assert spearman > 0.8
    uniform = _expert_counts(Workload(hidden=128, tokens_per_rank=4096, topk=2, experts_per_rank=8), world)
    assert float(uniform.max()) < 1.3 * float(uniform.min())  # the contrast: uniform is flat


@pytest.mark.parametrize(("hot_experts", "share"), [(1, 0.2), (1, 0.5), (2, 0.8), (1, 0.0)])
def test_hot_share_is_honoured(hot_experts: int, share: float) -> None:
    world, epr, topk, tokens = 2, 8, 4, 8192
    wl = Workload(
        hidden=128, tokens_per_rank=tokens, topk=topk, experts_per_rank=epr,
        routing=RoutingSpec(kind="hot", hot_experts=hot_experts, hot_share=share, seed=3),
    )  # fmt: skip
    num_experts = epr * world
    hot = expert_popularity_order(wl, world)[:hot_experts]
    idx = torch.cat([r.topk_idx for r in route_all(wl, world)])
    has_hot = torch.isin(idx, hot).any(dim=1).double().mean().item()
    # a hot token holds a hot expert for sure; any other token by chance, choosing topk of all uniformly
    p_chance = 1 - math.comb(num_experts - hot_experts, topk) / math.comb(num_experts, topk)
    expected = share + (1 - share) * p_chance
    assert abs(has_hot - expected) < 0.025, (has_hot, expected)
