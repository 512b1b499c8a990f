"""The torch-symm-a2a backend class itself in real gloo ranks: its buffers, packing, dispatch (with and
without a layout) and combine, with only the symmetric-memory op replaced by gloo all_to_all_single of the
same semantics (symmetric buffers become plain tensors). The op itself is exercised on GPUs only."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from moelab.backends.base import CaseConfig, Placement
from moelab.backends.torch_symm_a2a import TorchSymmA2ABackend
from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure import checks
from moelab.measure.reference import make_tokens, reference_dispatch
from tests.distributed_helpers import gloo_context, run_ranks


class GlooExchange(TorchSymmA2ABackend):
    """all_to_all_vdev's contract (rows of split i go to rank i, received packed by source rank, counts and
    offsets written to out_splits_offsets) through gloo, reading the splits on the host."""

    def _exchange(
        self, send: torch.Tensor, recv: torch.Tensor, splits: torch.Tensor, so: torch.Tensor
    ) -> None:
        counts_out = torch.empty_like(splits)
        dist.all_to_all_single(counts_out, splits.clone(), group=self.ctx.group)
        sent, got = splits.tolist(), counts_out.tolist()
        dist.all_to_all_single(recv[: sum(got)], send[: sum(sent)], got, sent, group=self.ctx.group)
        so[0].copy_(counts_out)
        so[1].copy_(torch.cumsum(counts_out, 0) - counts_out)


def _plain_symm_mem() -> None:
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.get_backend = lambda device: "NVSHMEM"  # type: ignore[assignment]
    symm_mem.empty = lambda *shape, dtype, device: torch.empty(*shape, dtype=dtype, device=device)  # type: ignore[assignment]
    symm_mem.rendezvous = lambda tensor, group: None  # type: ignore[assignment]
    symm_mem.enable_symm_mem_for_group = lambda name: None  # type: ignore[assignment]


def _rank(rank: int, world: int, workloads: list[Workload]) -> list[dict[str, Any]]:
    _plain_symm_mem()
    ctx = gloo_context(rank, world)
    cases = [CaseConfig(case_id=f"c{i}", workload=wl) for i, wl in enumerate(workloads)]
    backend = GlooExchange(ctx, cases)
    out = []
    for case in cases:
        assert backend.unsupported_reason(case) is None
        backend.prepare(case)
        wl = case.workload
        routings = route_all(wl, world)
        routing = routings[rank]
        x = make_tokens(wl, rank)
        expected = reference_dispatch(routings, rank, wl.experts_per_rank)
        layout = backend.layout(routing.topk_idx, routing.topk_weights)
        results = []
        handle = None
        for lay in (None, layout, layout, "handle"):
            # "handle": along an earlier dispatch's handle, as moelab.measure times the cached-layout dispatch
            given = handle if lay == "handle" else lay
            d = backend.dispatch(x, routing.topk_idx, routing.topk_weights, layout=given)
            handle = d.handle
            assert d.capacity >= wl.tokens_per_rank * world
            dc = checks.check_dispatch(d, expected, wl, world)
            assert dc.ok and dc.ref_rows is not None, dc.message
            expert_out = checks.expert_out_for(d, dc.ref_rows, rank, wl.experts_per_rank)
            assert expert_out.shape[0] == d.capacity
            combined = backend.combine(expert_out, d.handle)
            ok, err, msg = checks.check_combine(combined, x, routing, "bf16")
            assert ok, msg
            results.append(combined.clone())
            # combine also takes exactly the received rows
            exact = backend.combine(expert_out[: d.valid_count()], d.handle)
            assert torch.equal(exact, combined)
        assert all(torch.equal(results[0], r) for r in results[1:])
        out.append({"rows": d.valid_count(), "err": err})
    backend.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_backend_round_trip_over_gloo(world: int) -> None:
    workloads = [
        Workload(
            hidden=256, tokens_per_rank=40, topk=4, experts_per_rank=2, routing=RoutingSpec(kind=kind, seed=s)
        )
        for kind, s in (("uniform", 0), ("zipf", 1), ("hot", 2))
    ] + [Workload(hidden=160, tokens_per_rank=1, topk=1, experts_per_rank=1)]
    results = run_ranks(world, _rank, workloads)
    assert all(sum(r[i]["rows"] for r in results) > 0 for i in range(len(workloads)))


def test_knobs_and_odd_hidden_are_refused_before_anything_runs() -> None:
    """The class says it from the plan alone (what `moelab run --list-cases` shows), no rank needed."""
    where = Placement(world=2, gpus_per_node=2, comm_backend="nccl")

    def reason(cfg: CaseConfig) -> str:
        return TorchSymmA2ABackend.planned_reason(cfg, where) or ""

    wl = Workload(hidden=256, tokens_per_rank=8, topk=2, experts_per_rank=2)
    assert "unknown knob(s) layout" in reason(
        CaseConfig(case_id="a", workload=wl, knobs={"layout": "cached"})
    )
    odd = Workload(hidden=255, tokens_per_rank=8, topk=2, experts_per_rank=2)
    assert "hidden must be even" in reason(CaseConfig(case_id="b", workload=odd))
    assert "no SM control" in reason(CaseConfig(case_id="c", workload=wl, sms=16))
    fp8 = Workload(hidden=256, tokens_per_rank=8, topk=2, experts_per_rank=2, dtype="fp8")
    assert "no fp8" in reason(CaseConfig(case_id="d", workload=fp8))
    one_rank = Placement(world=1, gpus_per_node=1, comm_backend="nccl")
    assert "2 or more ranks" in (
        TorchSymmA2ABackend.planned_reason(CaseConfig(case_id="e", workload=wl), one_rank) or ""
    )
