"""Real multi-process gloo runs: nccl-a2a dispatch and combine equal the reference semantics."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from moelab.backends.base import CaseConfig
from moelab.backends.nccl_a2a import NcclA2ABackend, resolve_exchange
from moelab.backends.padded import received_rows
from moelab.core.errors import SpecError
from moelab.core.routing import Routing, route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure import checks
from moelab.measure.reference import make_tokens, reference_dispatch
from tests.distributed_helpers import gloo_context, run_ranks

pytestmark = pytest.mark.slow  # real multi-process gloo ranks: seconds per test


def _check_rank(
    rank: int,
    world: int,
    workload: Workload,
    routings: list[Routing] | None,
    layout: str = "fresh",
    exchange: str = "auto",
) -> dict[str, object]:
    ctx = gloo_context(rank, world)
    case = CaseConfig(case_id="t", workload=workload, knobs={"exchange": exchange})
    backend = NcclA2ABackend(ctx, [case])
    backend.prepare(case)
    recorded = backend.record(case)
    if exchange != "auto":
        assert recorded["exchange"] == exchange
    assert (backend.host_sync_ops() == {}) == (recorded["exchange"] == "allgather")  # no counts, no sync
    routings = routings if routings is not None else route_all(workload, world)
    routing = routings[rank]
    x = make_tokens(workload, rank)
    # "fresh": layout and payload in one call; "cached": the layout step alone, then the payload along it
    cached = backend.layout(routing.topk_idx, routing.topk_weights) if layout == "cached" else None
    d = backend.dispatch(x, routing.topk_idx, routing.topk_weights, layout=cached)
    expected = reference_dispatch(routings, rank, workload.experts_per_rank)
    dc = checks.check_dispatch(d, expected, workload, world)
    assert dc.ok, dc.message
    assert dc.ref_rows is not None
    expert_out = checks.expert_out_for(d, dc.ref_rows, rank, workload.experts_per_rank)
    out = backend.combine(expert_out, d.handle)
    ok, err, msg = checks.check_combine(out, x, routing, "bf16")
    assert ok, msg
    # buffers are reused: a second round gives the same answer
    d2 = backend.dispatch(x, routing.topk_idx, routing.topk_weights, layout=d.handle if cached else None)
    out2 = backend.combine(expert_out, d2.handle)
    assert torch.equal(out, out2)
    # the backward of combine (e2e): each token's row back to where dispatch sent it, in received order
    back = backend.dispatch_with_handle(x, d.handle)
    assert torch.equal(received_rows(replace(d, recv_x=back)).recv_x, received_rows(d).recv_x)
    return {"rows": received_rows(d).num_rows, "combine_err": err, "exchange": recorded["exchange"]}


def _check_many(rank: int, world: int, workloads: list[Workload]) -> list[dict[str, object]]:
    return [
        _check_rank(rank, world, wl, None, layout, exchange)
        for wl in workloads
        for layout in ("fresh", "cached")
        for exchange in ("splits", "allgather")
    ]


@pytest.mark.parametrize("world", [2, 4])
def test_dispatch_combine_equal_reference(world: int) -> None:
    """Several seeds and routings, one set of spawned ranks per world size (spawning costs seconds)."""
    workloads = [
        Workload(
            hidden=256,
            tokens_per_rank=64,
            topk=4,
            experts_per_rank=2,
            routing=RoutingSpec(kind=kind, seed=seed),
        )
        for kind, seed in (("uniform", 0), ("uniform", 7), ("zipf", 1), ("hot", 3))
    ]
    results = run_ranks(world, _check_many, workloads)
    assert all(sum(r[i]["rows"] for r in results) > 0 for i in range(4 * len(workloads)))  # type: ignore[misc]
    # both exchanges receive exactly the same rows
    for r in results:
        assert [c["rows"] for c in r[0::2]] == [c["rows"] for c in r[1::2]]


def test_topk_one_and_tokens_per_rank_one() -> None:
    run_ranks(
        2,
        _check_many,
        [
            Workload(hidden=128, tokens_per_rank=1, topk=1, experts_per_rank=1),
            Workload(hidden=128, tokens_per_rank=33, topk=1, experts_per_rank=3),
        ],
    )


def _all_to_expert_zero(workload: Workload, world: int) -> list[Routing]:
    """Every token of every rank picks expert 0 (rank 0) only: ranks > 0 receive nothing."""
    t = workload.tokens_per_rank
    return [Routing(torch.zeros(t, 1, dtype=torch.int64), torch.ones(t, 1)) for _ in range(world)]


def test_every_token_to_one_expert_and_empty_ranks() -> None:
    wl = Workload(hidden=128, tokens_per_rank=16, topk=1, experts_per_rank=2)
    results = run_ranks(4, _check_rank, wl, _all_to_expert_zero(wl, 4))
    assert [r["rows"] for r in results] == [64, 0, 0, 0]
    assert results[0]["exchange"] == "splits"  # auto: a quarter of the (token, rank) pairs is sent


def _broken_rank(rank: int, world: int, workload: Workload) -> str:
    """A dispatch that drops a row must be caught by the check (the check can fail)."""
    ctx = gloo_context(rank, world)
    case = CaseConfig(case_id="t", workload=workload)
    backend = NcclA2ABackend(ctx, [case])
    backend.prepare(case)
    routings = route_all(workload, world)
    d = backend.dispatch(make_tokens(workload, rank), routings[rank].topk_idx, routings[rank].topk_weights)
    d.recv_x = d.recv_x.clone()
    d.recv_x[0, 200] += 1.0  # corrupt one payload element
    dc = checks.check_dispatch(
        d, reference_dispatch(routings, rank, workload.experts_per_rank), workload, world
    )
    return dc.message


def test_check_detects_corruption() -> None:
    wl = Workload(hidden=256, tokens_per_rank=32, topk=2, experts_per_rank=2)
    messages = run_ranks(2, _broken_rank, wl)
    assert all("payload error" in m for m in messages)


def test_exchange_knob_auto_resolution_and_refusal() -> None:
    """auto takes allgather only where nearly every (token, rank) pair is sent; bad values are refused."""
    dense = Workload(hidden=128, tokens_per_rank=256, topk=8, experts_per_rank=8)  # 16 experts, 2 ranks
    assert resolve_exchange({}, dense, 2)[0] == "allgather"
    assert resolve_exchange({}, dense, 2)[1] > 0.99
    sparse = Workload(hidden=128, tokens_per_rank=256, topk=2, experts_per_rank=2)  # 8 experts, 4 ranks
    exchange, fill = resolve_exchange({}, sparse, 4)
    assert exchange == "splits" and 0.3 < fill < 0.6
    assert resolve_exchange({"exchange": "allgather"}, sparse, 4)[0] == "allgather"
    assert resolve_exchange({"exchange": "splits"}, dense, 2)[0] == "splits"
    with pytest.raises(SpecError, match="exchange must be one of"):
        NcclA2ABackend.check_knobs({"exchange": "ring"}, dense)
    with pytest.raises(SpecError, match="unknown knob"):
        NcclA2ABackend.check_knobs({"exchnge": "splits"}, dense)
