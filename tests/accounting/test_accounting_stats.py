"""Byte accounting against routings small enough to count by hand, bandwidth arithmetic, and the timing
summary (slowest rank per iteration, percentiles, rank spread) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.bandwidth import DEFINITIONS, RankRows, bandwidths, count_rows
from moelab.core.routing import Routing, route_all
from moelab.core.stats import iteration_times, summarize
from moelab.core.workload import RoutingSpec, Workload
from moelab.model.traffic import count

# world 4, 2 experts per rank (expert e lives on rank e // 2), topk 2, 2 tokens per rank.
# Destination ranks per token, written out:
#   rank 0: [0, 1] -> {0}      [2, 7] -> {1, 3}
#   rank 1: [4, 5] -> {2}      [3, 6] -> {1, 3}
#   rank 2: [0, 4] -> {0, 2}   [5, 4] -> {2}
#   rank 3: [6, 7] -> {3}      [1, 2] -> {0, 1}
HAND_IDX = [
    [[0, 1], [2, 7]],
    [[4, 5], [3, 6]],
    [[0, 4], [5, 4]],
    [[6, 7], [1, 2]],
]
EXPERTS_PER_RANK = 2


def _routings() -> list[Routing]:
    return [
        Routing(torch.tensor(idx, dtype=torch.int64), torch.full((2, 2), 0.5, dtype=torch.float32))
        for idx in HAND_IDX
    ]


# send: rows a rank's tokens make (one per destination rank); recv: rows arriving at a rank.
#   src->dst rows: 0->{0:1, 1:1, 3:1}  1->{1:1, 2:1, 3:1}  2->{0:1, 2:2}  3->{0:1, 1:1, 3:1}
#   recv: dst0 = 1+1+1 (own 1), dst1 = 1+1+1 (own 1), dst2 = 1+2 (own 2), dst3 = 1+1+1 (own 1)
SEND = [3, 3, 3, 3]
SEND_REMOTE = [2, 2, 1, 2]
RECV = [3, 3, 3, 3]
RECV_REMOTE = [2, 2, 1, 2]
# (token, destination node) pairs.
# gpus_per_node=2, nodes {0,1} and {2,3}:
#   rank 0 (node 0): {0}->{n0}, {1,3}->{n0,n1}: 3 pairs, 1 remote
#   rank 1 (node 0): {2}->{n1}, {1,3}->{n0,n1}: 3 pairs, 2 remote
#   rank 2 (node 1): {0,2}->{n0,n1}, {2}->{n1}: 3 pairs, 1 remote
#   rank 3 (node 1): {3}->{n1}, {0,1}->{n0}: 2 pairs, 1 remote
RDMA_GPN2 = [3, 3, 3, 2]
RDMA_REMOTE_GPN2 = [1, 2, 1, 1]


def _expected(rdma: list[int], rdma_remote: list[int]) -> list[RankRows]:
    return [
        RankRows(
            rank=r, recv_rows=RECV[r], recv_rows_remote=RECV_REMOTE[r], send_rows=SEND[r],
            send_rows_remote=SEND_REMOTE[r], rdma_pairs=rdma[r], rdma_pairs_remote=rdma_remote[r],
        )
        for r in range(4)
    ]  # fmt: skip


def test_count_rows_two_nodes_of_two() -> None:
    assert count_rows(_routings(), EXPERTS_PER_RANK, gpus_per_node=2) == _expected(
        RDMA_GPN2, RDMA_REMOTE_GPN2
    )


def test_count_rows_one_gpu_per_node() -> None:
    # every rank its own node: node pairs are rank pairs, so RDMA rows equal send rows
    assert count_rows(_routings(), EXPERTS_PER_RANK, gpus_per_node=1) == _expected(SEND, SEND_REMOTE)


def test_count_rows_one_node() -> None:
    # one node of 4: each token goes to the node once and nothing leaves it
    assert count_rows(_routings(), EXPERTS_PER_RANK, gpus_per_node=4) == _expected([2, 2, 2, 2], [0, 0, 0, 0])


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["uniform", "zipf", "hot"]),
    seed=st.integers(0, 1000),
    nodes=st.integers(1, 3),
    gpus_per_node=st.integers(1, 3),
    epr=st.integers(1, 4),
    data=st.data(),
)
def test_count_rows_conservation_and_internode_agreement(
    kind: str, seed: int, nodes: int, gpus_per_node: int, epr: int, data: st.DataObject
) -> None:
    world = nodes * gpus_per_node
    topk = data.draw(st.integers(1, epr * world))
    wl = Workload(
        hidden=128,
        tokens_per_rank=24,
        topk=topk,
        experts_per_rank=epr,
        routing=RoutingSpec(kind=kind, seed=seed),
    )
    routings = route_all(wl, world)
    rows = count_rows(routings, epr, gpus_per_node)
    assert sum(r.send_rows for r in rows) == sum(r.recv_rows for r in rows)
    assert sum(r.send_rows_remote for r in rows) == sum(r.recv_rows_remote for r in rows)
    for r in rows:
        assert wl.tokens_per_rank <= r.send_rows <= wl.tokens_per_rank * min(topk, world)
        assert r.rdma_pairs_remote <= r.rdma_pairs <= r.send_rows
    # an independent oracle (sets, not masks) for the one RDMA counter, and the model counts the same
    oracle = []
    for src, routing in enumerate(routings):
        nodes = [{e // epr // gpus_per_node for e in row} for row in routing.topk_idx.tolist()]
        oracle.append((sum(len(n) for n in nodes), sum(len(n - {src // gpus_per_node}) for n in nodes)))
    assert [(r.rdma_pairs, r.rdma_pairs_remote) for r in rows] == oracle
    other = count(routings, experts_per_rank=epr, gpus_per_node=gpus_per_node)
    assert [(r.definitions["rdma_pairs"], r.definitions["rdma_pairs_remote"]) for r in other.ranks] == oracle


def test_bandwidths_arithmetic() -> None:
    rows = count_rows(_routings(), EXPERTS_PER_RANK, gpus_per_node=2)
    bw = {b.definition: b for b in bandwidths(rows, bytes_per_row=256, time_us=10.0)}
    # bytes per rank: mean and max over ranks of rows x 256; GB/s = mean bytes / 10 us / 1e9
    expected = {
        "nvl_recv": (3 * 256, 3 * 256),
        "nvl_remote": (7 / 4 * 256, 2 * 256),
        "rdma_pairs": (11 / 4 * 256, 3 * 256),
        "rdma_remote": (5 / 4 * 256, 2 * 256),
        "algbw_send": (3 * 256, 3 * 256),
    }
    for name, (mean, mx) in expected.items():
        assert bw[name].bytes_mean == pytest.approx(mean)
        assert bw[name].bytes_max == pytest.approx(mx)
        assert bw[name].gbps == pytest.approx(mean / 10e-6 / 1e9)
    assert bw["nvl_recv"].gbps == pytest.approx(0.0768)
    # figures from other inputs (trace kernel time, nccl-tests' own output) are not derived here
    assert not any(n.endswith("_kernel") or n.startswith("nccl_") for n in bw)
    assert set(bw) <= set(DEFINITIONS)


def test_bandwidths_zero_time_is_nan_not_infinite() -> None:
    rows = count_rows(_routings(), EXPERTS_PER_RANK, gpus_per_node=2)
    assert all(math.isnan(b.gbps) for b in bandwidths(rows, bytes_per_row=256, time_us=0.0))


def test_summarize_against_hand_values() -> None:
    samples = [
        [1.0, 5.0, 3.0, 7.0],  # rank 0, iterations 0..3
        [2.0, 4.0, 6.0, 8.0],  # rank 1
    ]
    # slowest rank per iteration: [2, 5, 6, 8]; linear-interpolated percentiles over 4 values
    assert iteration_times(samples).tolist() == [2.0, 5.0, 6.0, 8.0]
    s = summarize(samples)
    assert s.n == 4
    assert s.median_us == pytest.approx(5.5)
    assert s.p10_us == pytest.approx(2.9)  # 2 + 0.3 x 3
    assert s.p90_us == pytest.approx(7.4)  # 6 + 0.7 x 2
    assert s.p99_us == pytest.approx(7.94)  # 6 + 0.97 x 2
    assert (s.min_us, s.max_us) == (2.0, 8.0)
    assert s.mean_us == pytest.approx(5.25)
    assert s.rank_spread_us == pytest.approx(1.0)  # median of |rank gaps| [1, 1, 3, 1]
    assert s.rel_iqr == pytest.approx((6.5 - 4.25) / 5.5)  # p75 6.5, p25 4.25


def test_summarize_one_rank_one_iteration() -> None:
    s = summarize([[42.0]])
    assert (s.n, s.median_us, s.p10_us, s.p99_us, s.rank_spread_us, s.rel_iqr) == (
        1,
        42.0,
        42.0,
        42.0,
        0.0,
        0.0,
    )


@pytest.mark.parametrize("bad", [[], [[]], [1.0, 2.0]])
def test_summarize_rejects_non_tables(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        summarize(bad)  # type: ignore[arg-type]


def test_library_figures_follow_each_librarys_own_test() -> None:
    from moelab.backends.capabilities import library_figures
    from moelab.backends.deepep import DeepEPBackend
    from moelab.backends.hybrid_ep import HybridEPBackend
    from moelab.backends.nccl_a2a import NcclA2ABackend
    from moelab.core.bandwidth import RankRows

    def library_figure(
        backend: str, rows: list[RankRows], bpr: int, samples: list[list[float]], op: str = "dispatch"
    ):  # type: ignore[no-untyped-def]
        cls = {"deepep": DeepEPBackend, "hybrid-ep": HybridEPBackend, "nccl-a2a": NcclA2ABackend}[backend]
        got = library_figures(cls, op, rows, bpr, samples)  # none for a backend without LibraryFigures
        return got[0] if got else None

    rows = [
        RankRows(
            rank=0,
            recv_rows=100,
            recv_rows_remote=50,
            send_rows=100,
            send_rows_remote=50,
            rdma_pairs=100,
            rdma_pairs_remote=0,
        ),
        RankRows(
            rank=1,
            recv_rows=300,
            recv_rows_remote=150,
            send_rows=300,
            send_rows_remote=150,
            rdma_pairs=300,
            rdma_pairs_remote=0,
        ),
    ]
    samples = [[1000.0, 10.0, 20.0], [30.0, 30.0, 30.0]]
    # DeepEP: rank 0's bytes over rank 0's mean after dropping the first (warm-up-like) sample: 15 us
    deepep = library_figure("deepep", rows, 1000, samples)
    assert deepep is not None and deepep.definition == "deepep_nvl"
    assert deepep.gbps == pytest.approx(100 * 1000 / 15e-6 / 1e9)
    # Hybrid-EP: rank 0's bytes over the mean of the ranks' means: (343.33 + 30) / 2 us
    hybrid = library_figure("hybrid-ep", rows, 1000, samples)
    assert hybrid is not None and hybrid.definition == "hybrid_ep_rank0_bytes_over_mean_time"
    assert hybrid.gbps == pytest.approx(100 * 1000 / (((1030.0 / 3) + 30.0) / 2 * 1e-6) / 1e9)
    assert library_figure("nccl-a2a", rows, 1000, samples) is None
    # only the paths the libraries' tests time carry their names: not a fresh dispatch, not a round trip
    for op in ("dispatch_fresh", "roundtrip", "layout"):
        assert library_figure("deepep", rows, 1000, samples, op) is None
        assert library_figure("hybrid-ep", rows, 1000, samples, op) is None
    assert library_figure("deepep", rows, 1000, samples, "combine") is not None
