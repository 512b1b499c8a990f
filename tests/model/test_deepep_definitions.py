"""The model's byte definitions against DeepEP's own tests' counting (deepseek-ai/DeepEP at tag v1.2.1):

- tests/test_intranode.py: "NVL" bytes = `recv_x.numel() * 2` (the rows a rank receives, its own included),
  times `(1 + 4/128) / 2` for FP8; combine sends the same rows back in BF16;
- tests/test_internode.py: "RDMA" bytes = `num_rdma_token_sent * hidden * 2`, where `num_rdma_token_sent`
  counts the distinct `topk_idx // (num_experts // num_nodes)` of each token (unique (token, node) pairs,
  its own node included), times the same FP8 factor;
- tests/test_low_latency.py: per (token, expert) selection `hidden + hidden/128*4 + 16` bytes in FP8
  dispatch and `hidden * 2` in BF16 combine.
Each is re-counted here from the same topk_idx the way those tests count it, written anew (no DeepEP code).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.model.bound import bound, bytes_per_row, estimate
from moelab.model.links import PeakTable
from moelab.model.topology import TopologyRequest, resolve
from moelab.model.traffic import traffic
from tests.deepep_byte_counts import deepep_nvl_figure, deepep_rdma_pairs

FP8_FACTOR = (1 + 4 / 128) / 2


def _deepep_counts(
    topk_idx: list[torch.Tensor], num_experts: int, gpus_per_node: int
) -> tuple[list[int], list[int], list[int]]:
    """Per rank: rows received (NVL), unique (token, node) pairs sent (RDMA), selections (LL)."""
    world = len(topk_idx)
    nodes = world // gpus_per_node
    recv = [0] * world
    rdma, selections = [], []
    for idx in topk_idx:
        rank_idx = idx // (num_experts // world)
        is_token_in_rank = torch.zeros(idx.shape[0], world, dtype=torch.bool).scatter_(1, rank_idx, True)
        for r in range(world):
            recv[r] += int(is_token_in_rank[:, r].sum())
        node_idx = idx // (num_experts // nodes)
        rdma.append(int(torch.zeros(idx.shape[0], nodes, dtype=torch.bool).scatter_(1, node_idx, True).sum()))
        selections.append(int(idx.ne(-1).sum()))
    return recv, rdma, selections


@settings(max_examples=25, deadline=None)
@given(
    g=st.sampled_from([1, 2, 4, 8]),
    nodes=st.integers(1, 4),
    epr=st.integers(1, 4),
    kind=st.sampled_from(["uniform", "grouped", "zipf"]),
    seed=st.integers(0, 3),
)
def test_definitions_are_deepeps(g: int, nodes: int, epr: int, kind: str, seed: int) -> None:
    world, hidden = g * nodes, 256
    topk = min(8, world * epr)
    routing = RoutingSpec(kind=kind, seed=seed, group_ranks=g, topk_groups=min(4, nodes))
    topk = min(topk, routing.groups_per_token(world) * g * epr) if kind == "grouped" else topk
    wl = Workload(
        hidden=hidden, tokens_per_rank=64, topk=topk, experts_per_rank=epr, routing=routing, dtype="fp8"
    )
    routings = route_all(wl, world)
    recv, rdma, selections = _deepep_counts([r.topk_idx for r in routings], epr * world, g)
    tr = traffic(wl, world, g, counted=True)
    topology = resolve(
        TopologyRequest(nodes=nodes, gpus_per_node=g, gpu="H800", nic="ConnectX-7"), PeakTable()
    )
    est = estimate(tr, topology, hidden=hidden, dtype="fp8", combine_dtype="bf16")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for family in ("flat", "hierarchical", "low_latency"):
        dispatch, combine = est.get(family, "dispatch"), est.get(family, "combine")
        assert dispatch.definitions["nvl_recv"] == pytest.approx(mean(recv) * hidden * 2 * FP8_FACTOR)
        assert combine.definitions["nvl_recv"] == pytest.approx(mean(recv) * hidden * 2)
        assert dispatch.definitions["rdma_pairs"] == pytest.approx(mean(rdma) * hidden * 2 * FP8_FACTOR)
        assert combine.definitions["rdma_pairs"] == pytest.approx(mean(rdma) * hidden * 2)
        assert dispatch.definitions["ll_selections"] == pytest.approx(
            mean(selections) * (hidden + hidden / 128 * 4 + 16)
        )
        assert combine.definitions["ll_selections"] == pytest.approx(mean(selections) * hidden * 2)
    # and moelab's own DeepEP-convention figures (moelab.backends.deepep_common) count the same bytes
    nvl = deepep_nvl_figure(recv[0], hidden, "fp8", time_us=1.0)
    assert nvl.bytes == pytest.approx(recv[0] * bytes_per_row("hierarchical", "dispatch", hidden, "fp8"))
    rank_idx = routings[0].topk_idx // epr
    in_rank = torch.zeros(rank_idx.shape[0], world, dtype=torch.bool).scatter_(1, rank_idx, True)
    assert deepep_rdma_pairs(in_rank, g) == rdma[0] == tr.ranks[0].definitions["rdma_pairs"]


def test_low_latency_bytes_do_not_depend_on_the_expert_count() -> None:
    """The published low-latency rows were measured at 288 experts (the test's default then) or 256: the
    selections, and so the bytes, are topk per token either way."""
    wl256 = Workload(hidden=7168, tokens_per_rank=128, topk=8, experts_per_rank=32, dtype="fp8")
    wl288 = Workload(hidden=7168, tokens_per_rank=128, topk=8, experts_per_rank=36, dtype="fp8")
    topology = resolve(TopologyRequest(nodes=1, gpus_per_node=8, gpu="H800"), PeakTable())
    b = [
        bound(traffic(w, 8, 8), topology, "low_latency", "dispatch", hidden=7168, dtype="fp8")
        for w in (wl256, wl288)
    ]
    assert b[0].definitions["ll_selections"] == b[1].definitions["ll_selections"] == 128 * 8 * 7408
