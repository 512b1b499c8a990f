"""`mxfp8-a2a` in real gloo ranks (world 2 and 4): dispatch delivers exactly dequantize(quantize(token)) and the
routing of the reference; combine equals the reference sums with the quantization the knobs ask for (and
not the other), within bf16 summation rounding; plus the host-side checks that need no process group."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from moelab.backends import registry
from moelab.backends.base import CaseConfig
from moelab.backends.mxfp8_a2a import Mxfp8A2ABackend
from moelab.backends.padded import received_rows
from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure import checks
from moelab.measure.reference import (
    COMBINE_TOL,
    expert_output,
    make_tokens,
    reference_dispatch,
    relative_error,
)
from moelab.quant import mxfp8
from tests.distributed_helpers import gloo_context, run_ranks

BF16_SUM_TOL = 2.0**-7  # a few bf16 roundings of sums over <= 4 ranks


def _round_trip(rows: torch.Tensor, rounding: str) -> torch.Tensor:
    data, scales = mxfp8.quantize_mxfp8(rows, rounding, "torch")
    return mxfp8.dequantize_mxfp8(data, scales, torch.bfloat16, "torch")


def _ideal_combine(workload: Workload, rank: int, world: int, quantize: str | None) -> torch.Tensor:
    """What rank `rank` must get back: every rank's expert output for its tokens (round-tripped through
    MXFP8 with rounding `quantize`, or not when None), summed in float64."""
    routings = route_all(workload, world)
    x = make_tokens(workload, rank)
    ideal = torch.zeros(workload.tokens_per_rank, workload.hidden, dtype=torch.float64)
    for dest in range(world):
        exp = reference_dispatch(routings, dest, workload.experts_per_rank)
        sel = torch.nonzero(exp.src_rank == rank).squeeze(1)
        tokens = exp.src_token[sel]
        partial = expert_output(
            x[tokens], exp.topk_idx_local[sel], exp.topk_weights[sel], dest, workload.experts_per_rank
        )
        if quantize is not None:
            partial = _round_trip(partial, quantize)
        ideal.index_add_(0, tokens, partial.double())
    return ideal


def _check_cases(rank: int, world: int, specs: list[tuple[Workload, dict[str, Any]]]) -> list[dict[str, Any]]:
    cases = [CaseConfig(case_id=f"c{i}", workload=w, knobs=k) for i, (w, k) in enumerate(specs)]
    backend = Mxfp8A2ABackend(gloo_context(rank, world), cases)
    results = []
    for case in cases:
        wl = case.workload
        assert backend.unsupported_reason(case) is None
        backend.prepare(case)
        recorded = backend.record(case)
        routings = route_all(wl, world)
        routing = routings[rank]
        x = make_tokens(wl, rank)

        d = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
        assert d.recv_x.dtype == torch.bfloat16 and d.recv_x.shape[1] == wl.hidden and d.recv_scales is None
        dc = checks.check_dispatch(d, reference_dispatch(routings, rank, wl.experts_per_rank), wl, world)
        assert dc.ok, dc.message
        assert dc.ref_rows is not None
        got = received_rows(d).recv_x  # an allgather exchange also holds the slots of other ranks' tokens
        if recorded["dispatch_impl"] == "mxfp8":
            assert torch.equal(got, _round_trip(dc.ref_rows, recorded["rounding"]))
        else:
            assert torch.equal(got, dc.ref_rows)

        expert_out = checks.expert_out_for(d, dc.ref_rows, rank, wl.experts_per_rank)
        out = backend.combine(expert_out, d.handle)
        assert out.dtype == torch.bfloat16
        ok, err, msg = checks.check_combine(out, x, routing, recorded["combine_impl"])
        assert ok, msg
        quantized = recorded["combine_impl"] == "mxfp8"
        ideal = _ideal_combine(wl, rank, world, recorded["rounding"] if quantized else None)
        other = _ideal_combine(wl, rank, world, None if quantized else recorded["rounding"])
        err_ideal, err_other = relative_error(out, ideal), relative_error(out, other)
        assert err_ideal <= BF16_SUM_TOL, err_ideal
        assert err_other > 2 * err_ideal, (err_other, err_ideal)  # the check tells the two paths apart

        again = backend.combine(
            expert_out, backend.dispatch(x, routing.topk_idx, routing.topk_weights).handle
        )
        assert torch.equal(out, again)  # reused buffers, same answer
        results.append({"dispatch_err": dc.error, "combine_err": err, "recorded": recorded})
    backend.close()
    return results


WORLD2 = [
    (Workload(hidden=256, tokens_per_rank=64, topk=4, experts_per_rank=4, dtype="mxfp8"), {}),
    (
        Workload(
            hidden=224,
            tokens_per_rank=40,
            topk=2,
            experts_per_rank=2,
            dtype="mxfp8",
            routing=RoutingSpec(kind="zipf", seed=2),
        ),
        {"combine_impl": "bf16", "rounding": "floor"},
    ),
    (Workload(hidden=128, tokens_per_rank=32, topk=2, experts_per_rank=2), {"quantizer": "torch"}),
    (Workload(hidden=128, tokens_per_rank=32, topk=3, experts_per_rank=2), {"combine_impl": "bf16"}),
]
WORLD4 = [
    (
        Workload(
            hidden=256,
            tokens_per_rank=48,
            topk=4,
            experts_per_rank=2,
            dtype="mxfp8",
            routing=RoutingSpec(kind="hot", seed=3),
        ),
        {},
    ),
    (
        Workload(hidden=160, tokens_per_rank=24, topk=1, experts_per_rank=1),
        {"combine_impl": "mxfp8", "rounding": "floor"},
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("world,specs", [(2, WORLD2), (4, WORLD4)], ids=["world2", "world4"])
def test_dispatch_combine_match_reference_within_quantization(world: int, specs: list[Any]) -> None:
    per_rank = run_ranks(world, _check_cases, specs)
    for i, (wl, _) in enumerate(specs):
        recorded = per_rank[0][i]["recorded"]
        assert recorded["quantizer"] in ("torch", "none") and recorded["comm_backend"] == "gloo"
        dispatch_err = max(r[i]["dispatch_err"] for r in per_rank)
        combine_err = max(r[i]["combine_err"] for r in per_rank)
        if wl.dtype == "mxfp8":
            assert 0 < dispatch_err <= 0.07  # MXFP8 rounds (E4M3: 3 mantissa bits)
        else:
            assert dispatch_err == 0
        assert combine_err <= COMBINE_TOL[recorded["combine_impl"]]


# ---- host side: no process group needed --------------------------------------------------------------


def _backend(*cases: CaseConfig) -> Mxfp8A2ABackend:
    return Mxfp8A2ABackend(gloo_context(0, 2, group=None), list(cases))


def _case(knobs: dict[str, Any] | None = None, **workload: Any) -> CaseConfig:
    return CaseConfig(
        case_id="c",
        workload=Workload(tokens_per_rank=4, hidden=workload.pop("hidden", 64), **workload),
        knobs=knobs or {},
    )


def test_registered_and_available_on_cpu() -> None:
    assert registry.load("mxfp8-a2a") is Mxfp8A2ABackend
    assert registry.availability("mxfp8-a2a") is None


@pytest.mark.parametrize(
    "case,reason",
    [
        (_case(hidden=48, dtype="mxfp8"), "divisible by 32"),
        (_case(hidden=48, knobs={"combine_impl": "mxfp8"}), "divisible by 32"),
        (_case({"colour": "red"}), "unknown knob"),
        (_case({"dispatch_impl": "mxfp8"}), "contradicts the workload dtype bf16"),
        (_case({"combine_impl": "fp8"}), "combine_impl must be one of bf16, mxfp8"),
        (_case({"rounding": "nearest"}), "rounding"),
        (_case({"quantizer": "triton"}, dtype="mxfp8"), "CUDA"),
        (_case({"quantizer": "torchao"}, dtype="mxfp8"), "torchao"),
        (_case(dtype="fp8"), "no fp8 dispatch payload"),
    ],
)
def test_unsupported_reasons(case: CaseConfig, reason: str) -> None:
    got = _backend().unsupported_reason(case)
    assert got is not None and reason in got, got


def test_no_quantization_needs_no_block_alignment() -> None:
    assert _backend().unsupported_reason(_case({"combine_impl": "bf16"}, hidden=48)) is None


def test_record_says_what_ran() -> None:
    case = _case(dtype="mxfp8", hidden=8192)
    rec = _backend(case).record(case)
    assert rec["dispatch_impl"] == rec["combine_impl"] == "mxfp8" and rec["rounding"] == "rceil"
    assert (
        rec["quantizer_requested"] == "auto" and rec["quantizer"] == "torch" and rec["dequantizer"] == "torch"
    )
    assert rec["dispatch_bytes_per_token"] == rec["combine_bytes_per_token"] == 8192 + 256
    bf16 = _case({"combine_impl": "bf16"})
    rec = _backend(bf16).record(bf16)
    assert (rec["quantizer"], rec["dispatch_bytes_per_token"], rec["combine_bytes_per_token"]) == (
        "none",
        128,
        128,
    )
