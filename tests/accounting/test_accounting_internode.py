"""Inter-node byte accounting (moelab.core.internode): hand-computed cases and properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.bandwidth import count_rows
from moelab.core.internode import internode_bytes
from moelab.core.routing import Routing, route_all
from moelab.core.workload import Workload


def _routing(rows: list[list[int]]) -> Routing:
    idx = torch.tensor(rows, dtype=torch.int64)
    return Routing(idx, torch.full(idx.shape, 1.0 / idx.shape[1]))


# 4 ranks, 1 expert per rank (expert e lives on rank e), 2 nodes of 2 GPUs: node 0 = {0, 1}, node 1 = {2, 3}
HAND = [
    _routing([[0, 1], [2, 3]]),  # rank 0: t0 -> node0 only; t1 -> node1 only
    _routing([[0, 2], [1, 3]]),  # rank 1: t0 -> both nodes; t1 -> both nodes
    _routing([[2, 3], [3, 1]]),  # rank 2: t0 -> node1; t1 -> both
    _routing([[0, 1], [0, 2]]),  # rank 3: t0 -> node0; t1 -> both
]


def test_hand_computed_two_nodes_of_two() -> None:
    acc = internode_bytes(HAND, experts_per_rank=1, gpus_per_node=2, bytes_per_token=10)
    assert [(r.node, r.rdma_rows, r.rdma_rows_remote) for r in acc.ranks] == [
        (0, 2, 1),  # rank 0: {node0}, {node1}
        (0, 4, 2),
        (1, 3, 1),
        (1, 3, 2),
    ]
    assert [r.rdma_bytes for r in acc.ranks] == [20, 40, 30, 30]
    assert [r.rdma_bytes_remote for r in acc.ranks] == [10, 20, 10, 20]
    # direct NVLink rows inside node 0: rank0 t0 -> rank1 (1), rank1 t0 -> rank0 (1) = 2
    # inside node 1: rank2 t0 -> rank3 (1), rank2 t1 -> rank3 (1), rank3 t1 -> rank2 (1) = 3
    assert [n.nvl_rows_direct for n in acc.nodes] == [2, 3]
    # forwarded (entry GPU = the sender's local index on each destination node):
    # node 0: r0t0 enters at 0, forwards to 1 (1); r1t0 enters at 1, forwards to 0 (1); r1t1 enters 1, dest {1}: 0;
    #         r2t1 (local 0) enters 0, dest {1}: 1; r3t0 (local 1) enters 1, dests {0,1}: 1; r3t1 enters 1, dest {0}: 1
    # node 1: r0t1 enters 2, dests {2,3}: 1; r1t0 enters 3, dest {2}: 1; r1t1 enters 3, dest {3}: 0;
    #         r2t0 enters 2, dests {2,3}: 1; r2t1 enters 2, dest {3}: 1; r3t1 enters 3, dest {2}: 1
    assert [n.nvl_rows_forwarded for n in acc.nodes] == [5, 5]
    assert [n.nvl_bytes_forwarded for n in acc.nodes] == [50, 50]


def test_one_gpu_per_node_rdma_equals_rank_rows() -> None:
    acc = internode_bytes(HAND, experts_per_rank=1, gpus_per_node=1, bytes_per_token=1)
    rows = count_rows(HAND, experts_per_rank=1, gpus_per_node=1)
    assert [r.rdma_rows for r in acc.ranks] == [r.send_rows for r in rows] == [4, 4, 4, 4]
    assert [r.rdma_rows_remote for r in acc.ranks] == [r.send_rows_remote for r in rows] == [3, 3, 3, 4]
    assert all(n.nvl_rows_direct == 0 and n.nvl_rows_forwarded == 0 for n in acc.nodes)


def test_one_node_has_no_remote_rdma() -> None:
    acc = internode_bytes(HAND, experts_per_rank=1, gpus_per_node=4, bytes_per_token=1)
    assert all(r.rdma_rows == 2 and r.rdma_rows_remote == 0 for r in acc.ranks)  # 2 tokens x 1 node
    rows = count_rows(HAND, experts_per_rank=1, gpus_per_node=4)
    assert acc.nodes[0].nvl_rows_direct == sum(r.send_rows_remote for r in rows)


def test_reference_workload_matches_moelab_accounting() -> None:
    wl = Workload(hidden=64, tokens_per_rank=256, topk=8, experts_per_rank=2)
    routings = route_all(wl, 8)
    acc = internode_bytes(routings, experts_per_rank=2, gpus_per_node=4, bytes_per_token=wl.bytes_per_token())
    rows = count_rows(routings, experts_per_rank=2, gpus_per_node=4)
    assert [r.rdma_rows for r in acc.ranks] == [r.rdma_pairs for r in rows]
    assert [r.rdma_rows_remote for r in acc.ranks] == [r.rdma_pairs_remote for r in rows]
    assert acc.ranks[0].rdma_bytes == rows[0].rdma_pairs * 128


def test_invalid_shapes() -> None:
    with pytest.raises(ValueError, match="multiple"):
        internode_bytes(HAND[:3], experts_per_rank=1, gpus_per_node=2, bytes_per_token=1)
    with pytest.raises(ValueError, match="beyond"):
        internode_bytes([_routing([[0, 5]])] * 2, experts_per_rank=1, gpus_per_node=1, bytes_per_token=1)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[Routing], int, int]:
    gpus_per_node = draw(st.integers(1, 3))
    nodes = draw(st.integers(1, 3))
    world = gpus_per_node * nodes
    epr = draw(st.integers(1, 3))
    topk = draw(st.integers(1, world * epr))
    tokens = draw(st.integers(1, 6))
    routings = []
    for _ in range(world):
        rows = [draw(st.permutations(range(world * epr)))[:topk] for _ in range(tokens)]
        routings.append(_routing(rows))
    return routings, epr, gpus_per_node


@settings(max_examples=60, deadline=None)
@given(_cases())
def test_properties(case: tuple[list[Routing], int, int]) -> None:
    routings, epr, gpn = case
    acc = internode_bytes(routings, experts_per_rank=epr, gpus_per_node=gpn, bytes_per_token=3)
    rows = count_rows(routings, experts_per_rank=epr, gpus_per_node=gpn)
    tokens = routings[0].topk_idx.shape[0]
    for r, ref in zip(acc.ranks, rows, strict=True):
        assert r.rdma_rows_remote <= r.rdma_rows <= ref.send_rows
        assert tokens <= r.rdma_rows  # every token reaches at least one node
        assert (r.rdma_rows, r.rdma_rows_remote) == (ref.rdma_pairs, ref.rdma_pairs_remote)
        assert r.rdma_bytes == 3 * r.rdma_rows and r.rdma_bytes_remote == 3 * r.rdma_rows_remote
    # every remote row of a flat all-to-all stays in its node (NVLink) or crosses nodes (NIC)
    cross_node = sum(
        1
        for src, rt in enumerate(routings)
        for dests in ({e // epr for e in row} for row in rt.topk_idx.tolist())
        for d in dests
        if d // gpn != src // gpn
    )
    assert sum(n.nvl_rows_direct for n in acc.nodes) + cross_node == sum(r.send_rows_remote for r in rows)
    # forwarding: each row delivered on a node either lands on its entry GPU or is forwarded once
    assert sum(n.nvl_rows_forwarded for n in acc.nodes) + sum(r.rdma_rows for r in acc.ranks) >= sum(
        r.send_rows for r in rows
    )
