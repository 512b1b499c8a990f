"""Per-link rows of every dispatch family (moelab.model.traffic) against brute-force counting over moelab's
generated routings, the uniform closed form against exact enumeration, and a hand-computed case."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.routing import Routing, route_all
from moelab.core.rows import count_rows
from moelab.core.workload import RoutingSpec, Workload
from moelab.model.traffic import DEFINITION_FIELDS, FAMILIES, closed_form, count, traffic
from tests.model.oracle import LINKS, brute_force


def _routing(rows: list[list[int]]) -> Routing:
    idx = torch.tensor(rows, dtype=torch.int64)
    return Routing(idx, torch.full(idx.shape, 1.0 / idx.shape[1]))


def _no_tokens(k: int) -> Routing:
    return Routing(torch.zeros(0, k, dtype=torch.int64), torch.zeros(0, k))


# 4 ranks, 1 expert per rank (expert e lives on rank e), 2 nodes of 2 GPUs: node 0 = {0, 1}, node 1 = {2, 3}
HAND = [
    _routing([[0, 1], [2, 3]]),  # rank 0: t0 -> node0 only; t1 -> node1 only
    _routing([[0, 2], [1, 3]]),  # rank 1: t0 -> both nodes; t1 -> both nodes
    _routing([[2, 3], [3, 1]]),  # rank 2: t0 -> node1; t1 -> both
    _routing([[0, 1], [0, 2]]),  # rank 3: t0 -> node0; t1 -> both
]


def test_hand_computed_two_nodes_of_two() -> None:
    t = count(HAND, experts_per_rank=1, gpus_per_node=2)
    assert [(r.definitions["rdma_pairs"], r.definitions["rdma_pairs_remote"]) for r in t.ranks] == [
        (2, 1),
        (4, 2),
        (3, 1),
        (3, 2),
    ]
    # flat NVLink rows inside node 0: r0t0 -> 1, r1t0 -> 0 (2); node 1: r2t0 -> 3, r2t1 -> 3, r3t1 -> 2 (3)
    flat = [r.families["flat"] for r in t.ranks]
    assert [f.intra_send for f in flat] == [1, 1, 2, 1]
    # forwarded by the entry GPU (the sender's local index on each destination node):
    # node 0: r0t0 enters 0 -> 1; r1t0 enters 1 -> 0; r2t1 enters 0 -> 1; r3t0 enters 1 -> 0; r3t1 enters 1 -> 0
    # node 1: r0t1 enters 2 -> 3; r1t0 enters 3 -> 2; r2t0 enters 2 -> 3; r2t1 enters 2 -> 3; r3t1 enters 3 -> 2
    hier = [r.families["hierarchical"] for r in t.ranks]
    assert [h.intra_send for h in hier] == [2, 3, 3, 2]
    assert [h.intra_recv for h in hier] == [3, 2, 2, 3]
    assert [h.nic_send for h in hier] == [1, 2, 1, 2]  # the remote (token, node) pairs
    # as the entry GPU of the other node's same local index: rank 0 takes rank 2's t1, rank 1 rank 3's t0 and
    # t1, rank 2 rank 0's t1, rank 3 rank 1's t0 and t1
    assert [h.nic_recv for h in hier] == [1, 2, 1, 2]


def test_one_node_hierarchical_is_flat() -> None:
    t = count(HAND, experts_per_rank=1, gpus_per_node=4)
    for r in t.ranks:
        assert r.families["hierarchical"] == r.families["flat"]
        assert r.families["flat"].nic_send == r.families["flat"].nic_recv == 0


def test_invalid_shapes() -> None:
    with pytest.raises(ValueError, match="nodes"):
        count(HAND[:3], experts_per_rank=1, gpus_per_node=2)
    with pytest.raises(ValueError, match="beyond"):
        count([_routing([[0, 5]])] * 2, experts_per_rank=1, gpus_per_node=1)


@st.composite
def _generated(draw: st.DrawFn) -> tuple[Workload, int, int]:
    g = draw(st.integers(1, 4))
    nodes = draw(st.integers(1, 3))
    world = g * nodes
    epr = draw(st.integers(1, 3))
    topk = draw(st.integers(1, min(6, world * epr)))
    kind = draw(st.sampled_from(["uniform", "zipf", "hot", "grouped"]))
    routing = RoutingSpec(kind=kind, seed=draw(st.integers(0, 5)))
    if kind == "grouped":
        group_ranks = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
        topk_groups = draw(st.integers(1, world // group_ranks))
        topk = min(topk, topk_groups * group_ranks * epr)
        routing = RoutingSpec(kind=kind, seed=routing.seed, group_ranks=group_ranks, topk_groups=topk_groups)
    wl = Workload(
        hidden=64, tokens_per_rank=draw(st.integers(1, 12)), topk=topk, experts_per_rank=epr, routing=routing
    )
    return wl, world, g


@settings(max_examples=80, deadline=None)
@given(_generated())
def test_counts_equal_brute_force_over_generated_routings(case: tuple[Workload, int, int]) -> None:
    wl, world, g = case
    routings = route_all(wl, world)
    model = traffic(wl, world, g, counted=True)
    defs, links = brute_force(routings, wl.experts_per_rank, g)
    for r in model.ranks:
        assert r.definitions == pytest.approx(defs[r.rank]), r.rank
        for family in FAMILIES:
            rows = r.families[family]
            assert [getattr(rows, k) for k in LINKS] == [links[family][k][r.rank] for k in LINKS], (
                family,
                r.rank,
            )
    # the stored definitions (moelab.core.rows.count_rows) are the same counts
    stored = count_rows(routings, wl.experts_per_rank, g)
    for r, s in zip(model.ranks, stored, strict=True):
        assert all(r.definitions[f] == getattr(s, f) for f in DEFINITION_FIELDS if f != "selections")
    # conservation: every link row sent is received, on every family
    for family in FAMILIES:
        for kind in ("intra", "nic"):
            sent = sum(getattr(r.families[family], f"{kind}_send") for r in model.ranks)
            assert sent == sum(getattr(r.families[family], f"{kind}_recv") for r in model.ranks)


@pytest.mark.parametrize(
    ("world", "g", "epr", "k"),
    [(2, 1, 2, 2), (4, 2, 1, 2), (4, 2, 2, 3), (6, 3, 1, 3), (6, 2, 2, 4), (8, 4, 1, 5)],
)
def test_closed_form_is_the_exact_expectation(world: int, g: int, epr: int, k: int) -> None:
    """Every k-subset of the experts equally likely for one token per rank: the average of brute-force
    counts over all of them is what the closed form says, exactly (as fractions)."""
    experts = world * epr
    subsets = list(itertools.combinations(range(experts), k))
    total_defs = dict.fromkeys(DEFINITION_FIELDS, Fraction(0))
    total_links = {f: dict.fromkeys(LINKS, Fraction(0)) for f in FAMILIES}
    for src in range(world):  # one source at a time: its token's routing alone varies
        for subset in subsets:
            routings = [_routing([list(subset)]) if r == src else _no_tokens(k) for r in range(world)]
            defs, links = brute_force(routings, epr, g)
            for f in DEFINITION_FIELDS:
                total_defs[f] += Fraction(defs[0][f], len(subsets))
            for family in FAMILIES:
                for key in LINKS:
                    total_links[family][key] += Fraction(links[family][key][0], len(subsets))
    wl = Workload(hidden=64, tokens_per_rank=1, topk=k, experts_per_rank=epr)
    closed = closed_form(wl, world, g).ranks[0]
    for f in DEFINITION_FIELDS:
        assert closed.definitions[f] == pytest.approx(float(total_defs[f]), abs=1e-12), f
    for family in FAMILIES:
        for key in LINKS:
            assert getattr(closed.families[family], key) == pytest.approx(
                float(total_links[family][key]), abs=1e-12
            )


def test_closed_form_send_side_equals_receive_side() -> None:
    wl = Workload(hidden=64, tokens_per_rank=100, topk=8, experts_per_rank=4)
    d = closed_form(wl, 16, 8).ranks[0].definitions
    assert d["send_rows"] == d["recv_rows"] and d["send_rows_remote"] == d["recv_rows_remote"]


def test_uniform_counts_approach_the_closed_form() -> None:
    wl = Workload(hidden=64, tokens_per_rank=6000, topk=8, experts_per_rank=2)
    counted, closed = traffic(wl, 16, 4, counted=True), traffic(wl, 16, 4)
    assert closed.method.startswith("closed form") and counted.method.startswith("counted")
    for f in DEFINITION_FIELDS:
        assert counted.mean(f) == pytest.approx(closed.mean(f), rel=0.01)


def test_no_closed_form_for_skewed_routing() -> None:
    with pytest.raises(ValueError, match="count it"):
        closed_form(Workload(routing=RoutingSpec(kind="zipf")), 4, 2)
