"""Real multi-process gloo runs of the e2e MoE layer: serial and overlapped, forward and forward+backward,
against the single-process float32 reference on the gathered tokens and weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from moelab.backends.base import CaseConfig
from moelab.backends.mxfp8_a2a import Mxfp8A2ABackend
from moelab.backends.nccl_a2a import A2AHandle, NcclA2ABackend
from moelab.core.case_record import CaseRecord
from moelab.core.routing import Routing, route_all
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec, TimingSpec
from moelab.core.workload import RoutingSpec, Workload
from moelab.job.rundir import JobFiles
from moelab.measure.case_context import CaseContext
from moelab.measure.e2e.bench import run_e2e_case
from moelab.measure.e2e.layer import MoELayer, layer_tokens, local_expert_weights, output_grad
from moelab.measure.e2e.overlap import Streams, forward_expert_pipelined, forward_hooked, forward_pipelined
from moelab.measure.e2e.reference import layer_tolerance, reference_layer
from moelab.measure.reference import relative_error
from moelab.measure.timing import Clock
from tests.distributed_helpers import gloo_context, run_ranks
from tests.e2e.hooked_backends import HookedA2A

pytestmark = pytest.mark.slow  # real multi-process gloo ranks: seconds per test

INTER = 16
SCHEDULES = (
    ("serial", 1, "loop"),
    ("chunked", 3, "padded"),  # the batched matmul over experts padded to the largest group
    ("tbo", 2, "grouped"),
    ("tbo", 2, "grouped-wide"),  # the grouped kernel with tail rows that force its wide tile
    ("expert", 2, "loop"),  # expert-chunked: masked routing per group of experts, outputs summed
    ("hook", 2, "grouped"),  # token micro-batches with the receive deferred to a hook (HookedA2A)
)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy().copy()


def _layer_rank(
    rank: int, world: int, wl: Workload, routings: list[Routing] | None = None
) -> list[dict[str, np.ndarray]]:
    """Each schedule: the forward output, then forward+backward's input and local weight gradients."""
    case = CaseConfig(case_id="t", workload=wl)
    backend = HookedA2A(gloo_context(rank, world), [case])
    backend.prepare(case)
    seed = wl.routing.seed
    r = (routings or route_all(wl, world))[rank]
    x = layer_tokens(seed, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    gout = output_grad(seed, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    results = []
    for mode, chunks, gemm in SCHEDULES:
        if gemm.startswith("grouped") and not hasattr(torch, "_grouped_mm"):
            gemm = "loop"
        weights = local_expert_weights(
            seed, rank, wl.experts_per_rank, wl.hidden, INTER, torch.device("cpu"), requires_grad=True
        )
        layer = MoELayer(backend, weights, wl.experts_per_rank, gemm)

        def forward(
            xx: torch.Tensor, layer: MoELayer = layer, mode: str = mode, chunks: int = chunks
        ) -> torch.Tensor:
            schedule = {"expert": forward_expert_pipelined, "hook": forward_hooked}.get(
                mode, forward_pipelined
            )
            if mode != "serial":
                return schedule(layer, xx, r.topk_idx, r.topk_weights, chunks, Streams(torch.device("cpu")))
            return layer.forward(xx, r.topk_idx, r.topk_weights)

        with torch.no_grad():
            out = forward(x)
        xg = x.detach().requires_grad_(True)
        forward(xg).backward(gout)
        assert xg.grad is not None and weights.w13.grad is not None and weights.w2.grad is not None
        results.append(
            {
                "out": _np(out),
                "grad_x": _np(xg.grad),
                "grad_w13": _np(weights.w13.grad),
                "grad_w2": _np(weights.w2.grad),
            }
        )
    return results


def _check_against_reference(wl: Workload, world: int, routings: list[Routing], per_rank: list[Any]) -> None:
    seed = wl.routing.seed
    x_all = torch.cat([layer_tokens(seed, r, wl.tokens_per_rank, wl.hidden, "cpu") for r in range(world)])
    g_all = torch.cat([output_grad(seed, r, wl.tokens_per_rank, wl.hidden, "cpu") for r in range(world)])
    ref = reference_layer(
        x_all, torch.cat([r.topk_idx for r in routings]), torch.cat([r.topk_weights for r in routings]),
        seed=seed, intermediate=INTER, grad_out=g_all, experts=range(wl.num_experts(world)),
    )  # fmt: skip
    assert ref.grad_x is not None
    tol = layer_tolerance("bf16", "bf16")
    for s in range(len(SCHEDULES)):

        def cat(key: str, s: int = s) -> torch.Tensor:
            return torch.cat([torch.from_numpy(per_rank[r][s][key]) for r in range(world)])

        errs = (
            relative_error(cat("out"), ref.out),
            relative_error(cat("grad_x"), ref.grad_x),
            relative_error(
                cat("grad_w13"), torch.stack([ref.grad_w13[e] for e in range(wl.num_experts(world))])
            ),
            relative_error(
                cat("grad_w2"), torch.stack([ref.grad_w2[e] for e in range(wl.num_experts(world))])
            ),
        )
        assert errs[0] < tol and all(e < 2 * tol for e in errs[1:]), (SCHEDULES[s], errs)


@pytest.mark.parametrize("world", [2, 4])
def test_layer_equals_single_process_reference(world: int) -> None:
    wl = Workload(hidden=64, tokens_per_rank=24, topk=4, experts_per_rank=2, routing=RoutingSpec(seed=3))
    routings = route_all(wl, world)
    _check_against_reference(wl, world, routings, run_ranks(world, _layer_rank, wl))


def test_layer_with_ranks_that_receive_nothing() -> None:
    """Every token picks experts 0 and 1 (rank 0's): rank 1 receives no rows and its experts get zero gradients."""
    wl = Workload(hidden=64, tokens_per_rank=10, topk=2, experts_per_rank=2)
    t = wl.tokens_per_rank
    routings = [Routing(torch.tensor([[0, 1]] * t), torch.full((t, 2), 0.5)) for _ in range(2)]
    per_rank = run_ranks(2, _layer_rank, wl, routings)
    _check_against_reference(wl, 2, routings, per_rank)
    assert all(not per_rank[1][s]["grad_w13"].any() for s in range(len(SCHEDULES)))


class HalvedCombine(NcclA2ABackend):
    """A broken backend: combine loses half of every row. The e2e check must call it incorrect."""

    def combine(self, expert_out: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        return super().combine(expert_out, handle) * 0.5


BACKENDS = {"nccl-a2a": NcclA2ABackend, "mxfp8-a2a": Mxfp8A2ABackend, "halved": HalvedCombine}


def _bench_rank(
    rank: int, world: int, backend_name: str, cases: list[CaseSpec], files: JobFiles | None = None
) -> list[CaseRecord]:
    ctx = gloo_context(rank, world)
    backend = BACKENDS[backend_name](ctx, [CaseConfig.of(c) for c in cases if not c.skip_reason])
    spec = RunSpec(
        run_id="t", created_at="2026-01-01T00:00:00+00:00", suite="e2e", backends=(backend_name,), cases=tuple(cases),
        timing=TimingSpec(warmup=1, iters=3, pair_reps=1, pair_iters=1, flush_l2=False), launch=LaunchSpec(nproc_per_node=world, gpus_per_node=world),
    )  # fmt: skip
    clock = Clock(ctx.device, ctx.group, False)
    cc = CaseContext(backend=backend, ctx=ctx, spec=spec, clock=clock, files=files)
    records = [run_e2e_case(cc, c) for c in cases]
    backend.close()
    return records


def _case(
    backend: str, wl: Workload, sms: int | None = None, skip: str | None = None, **knobs: Any
) -> CaseSpec:
    knobs = {"bench": "e2e", **knobs}
    case_id = "-".join([wl.label(), str(sms)] + [f"{k}={v}" for k, v in sorted(knobs.items())])
    return CaseSpec.from_asked(
        knobs=knobs, case_id=case_id, backend=backend, workload=wl, sms=sms, skip_reason=skip
    )


def _metric(rec: CaseRecord, name: str) -> float | None:
    return next(m.value for m in rec.metrics if m.name == name)


def test_run_e2e_case_records_nccl_a2a() -> None:
    world = 2
    wl = Workload(
        hidden=64, tokens_per_rank=32, topk=4, experts_per_rank=3, routing=RoutingSpec(kind="zipf", seed=1)
    )
    cases = [
        _case("nccl-a2a", wl, mode="serial", intermediate=INTER),
        _case("nccl-a2a", wl, mode="tbo", backward=True, intermediate=INTER),
        _case("nccl-a2a", wl, sms=16, mode="serial"),
        _case("nccl-a2a", wl, skip="topk 4 > total experts", mode="serial"),
        _case("nccl-a2a", wl, mode="serial", chunks=2),
    ]
    records = run_ranks(world, _bench_rank, "nccl-a2a", cases)[0]
    serial, overlap, sms, skipped, bad_knob = records
    assert [r.status for r in records] == ["ok", "ok", "unsupported", "skipped", "unsupported"]
    assert "SM control needs NCCL" in str(sms.reason) and "needs mode = chunked" in str(bad_knob.reason)
    alone = {
        "layer",
        "compute_only",
        "gemm",
        "permute",
        "gemm_mb",
        "gemm_mb_under_comm",
        "dispatch",
        "combine",
    }
    assert {o.op for o in serial.ops} == alone
    assert {o.op for o in overlap.ops} == alone | {
        "layer_serial",
        "compute_only_split",
        "layer_fwd_bwd",
        "layer_fwd_bwd_serial",
    }
    tolerance = layer_tolerance("bf16", "bf16")
    for rec in (serial, overlap):
        for o in rec.ops:
            samples = o.samples_us
            assert len(samples) == world and all(len(s) == 3 and all(v > 0 for v in s) for s in samples), o.op
            assert o.bytes_per_row == {"dispatch": 128, "combine": 128}.get(o.op, 0)
        err = _metric(rec, "layer_rel_err")
        assert rec.check is not None and not rec.check.messages and err is not None and err < tolerance
        assert len(rec.rows) == world and sum(r.send_rows for r in rec.rows) == sum(
            r.recv_rows for r in rec.rows
        )
        assert rec.backend_record["e2e"]["intermediate"] == INTER
        names = {m.name for m in rec.metrics}
        assert {
            "layer_us",
            "tokens_per_s_per_rank",
            "exposed_comm_us",
            "gemm_tflops_per_rank",
            "layer_rel_err",
        } <= names
        assert all(m.value is None or np.isfinite(m.value) for m in rec.metrics)
    by_name = {m.name: m.value for m in overlap.metrics}
    assert {
        "overlap_efficiency",
        "speedup_vs_serial",
        "split_overhead_us",
        "gemm_slowdown",
        "tokens_per_s_per_rank_fwd_bwd",
        "speedup_vs_serial_fwd_bwd",
    } <= set(by_name)
    assert by_name["grad_x_rel_err"] is not None and by_name["grad_x_rel_err"] < 2 * tolerance
    assert by_name["grad_w_rel_err"] is not None and by_name["grad_w_rel_err"] < 2 * tolerance
    assert "speedup_vs_serial" not in {m.name for m in serial.metrics}
    assert (
        serial.backend_record["e2e"]["mode"] == "serial"
        and overlap.backend_record["e2e"]["mode"] == "tbo"
        and overlap.backend_record["e2e"]["chunks"] == 2
    )


def test_run_e2e_case_mxfp8_both_ways_and_backward() -> None:
    wl = Workload(hidden=64, tokens_per_rank=16, topk=2, experts_per_rank=2, dtype="mxfp8")
    cases = [_case("mxfp8-a2a", wl, mode="tbo", backward=True, intermediate=INTER, quantizer="torch")]
    (rec,) = run_ranks(2, _bench_rank, "mxfp8-a2a", cases)[0]
    assert rec.status == "ok", rec.reason
    assert rec.backend_record["combine_impl"] == "mxfp8" and rec.backend_record["quantizer"] == "torch"
    err = _metric(rec, "layer_rel_err")
    assert err is not None and 0 < err < layer_tolerance("mxfp8", "mxfp8")
    dispatch = rec.op("dispatch")
    assert dispatch is not None and dispatch.bytes_per_row == 64 + 2


def test_broken_combine_is_incorrect_and_not_timed() -> None:
    wl = Workload(hidden=64, tokens_per_rank=16, topk=2, experts_per_rank=2)
    (rec,) = run_ranks(2, _bench_rank, "halved", [_case("halved", wl, mode="tbo", intermediate=INTER)])[0]
    assert rec.status == "incorrect" and "layer output error" in str(rec.reason)
    assert not rec.ops and rec.check is not None and rec.check.messages
