"""The overlapped layer's expert weight gradient, computed once after every part's backward
(moelab.measure.e2e.wgrad): the serial layer's gradients, fewer weight-sized GEMMs, the way chosen by bytes,
and through `moelab run`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.measure.e2e.grouped_gemm import unavailable_reason
from moelab.measure.e2e.layer import MoELayer, local_expert_weights
from moelab.measure.e2e.overlap import Streams, forward_expert_pipelined, forward_hooked, forward_pipelined
from moelab.measure.e2e.wgrad import DeferredWgrad, PartRows
from tests.e2e.cli_suite import run_nccl_a2a_e2e
from tests.e2e.test_e2e_layer import Loopback

needs_grouped = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch has no _grouped_mm")


def _inputs(tokens: int, experts: int, topk: int, hidden: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :topk]
    w = torch.rand(tokens, topk, generator=g)
    gout = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    return x, idx, w, gout


def _grads(
    gemm: str,
    run: Callable[[MoELayer, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    *shape: int,
    backend: Loopback | None = None,
) -> tuple[list[torch.Tensor], str]:
    tokens, experts, topk, hidden, inter, seed = shape
    x, idx, w, gout = _inputs(tokens, experts, topk, hidden, seed)
    weights = local_expert_weights(seed, 0, experts, hidden, inter, torch.device("cpu"), requires_grad=True)
    layer = MoELayer(backend or Loopback(), weights, experts, gemm)
    xg = x.clone().requires_grad_(True)
    run(layer, xg, idx, w).backward(gout)
    assert xg.grad is not None and weights.w13.grad is not None and weights.w2.grad is not None
    return [t.float() for t in (xg.grad, weights.w13.grad, weights.w2.grad)], layer.wgrad_how


CPU = torch.device("cpu")
SCHEDULES: dict[str, Callable[..., torch.Tensor]] = {
    "tbo": lambda layer, x, i, w: forward_pipelined(layer, x, i, w, 2, Streams(CPU)),
    "chunked3": lambda layer, x, i, w: forward_pipelined(layer, x, i, w, 3, Streams(CPU)),
    "expert2": lambda layer, x, i, w: forward_expert_pipelined(layer, x, i, w, 2, Streams(CPU)),
}


def _close(got: list[torch.Tensor], want: list[torch.Tensor], what: object) -> None:
    for a, b in zip(got, want, strict=True):
        err = ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()
        assert err < 2e-2, (what, err)  # bf16 gradients summed in another order


@needs_grouped
@pytest.mark.parametrize("gemm", ["grouped", "grouped-wide", "padded"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_deferred_weight_gradient_is_the_serial_layers(gemm: str, schedule: str) -> None:
    """Wide weights, few rows: regrouping pays, the merged gradient is the serial layer's; narrow weights,
    many rows: one GEMM per part, summed, as autograd did."""
    for shape, how in (((12, 4, 2, 32, 64, 1), "merged"), ((96, 3, 2, 32, 8, 2), "per part")):
        want, serial_how = _grads(gemm, lambda layer, x, i, w: layer.forward(x, i, w), *shape)
        got, got_how = _grads(gemm, SCHEDULES[schedule], *shape)
        assert serial_how == "" and got_how == how, (gemm, schedule, shape, got_how)
        _close(got, want, (gemm, schedule, shape))


def test_loop_gemm_keeps_autograds_weight_gradient() -> None:
    """The loop GEMM has no deferred path: autograd's own gradient, and none of ours recorded."""
    shape = (12, 4, 2, 32, 64, 1)
    want, _ = _grads("loop", lambda layer, x, i, w: layer.forward(x, i, w), *shape)
    got, how = _grads("loop", SCHEDULES["tbo"], *shape)
    assert how == ""
    _close(got, want, "loop")


@needs_grouped
def test_deferral_runs_fewer_weight_sized_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    """tbo's backward on grouped GEMMs (aten ops, as the profiler counts them): each part's two input
    gradients, then the merged weight gradient's two GEMMs (6), where autograd ran four per part (8)."""
    from torch.profiler import ProfilerActivity, profile

    x, idx, w, gout = _inputs(12, 4, 2, 32, 1)
    counts = {}
    for label in ("deferred", "autograd"):
        if label == "autograd":  # the same two parts with the deferral off: autograd's own
            monkeypatch.setattr(MoELayer, "deferring", _no_deferral)
        weights = local_expert_weights(1, 0, 4, 32, 64, CPU, requires_grad=True)
        layer = MoELayer(Loopback(), weights, 4, "grouped")
        xg = x.clone().requires_grad_(True)
        y = forward_pipelined(layer, xg, idx, w, 2, Streams(CPU))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            y.backward(gout)
        counts[label] = sum(e.count for e in prof.key_averages() if e.key == "aten::_grouped_mm")
    assert counts == {"deferred": 6, "autograd": 8}


def _no_deferral(self: MoELayer, parts: int) -> Any:
    import contextlib

    return contextlib.nullcontext(None)


@settings(max_examples=30, deadline=None)
@given(
    parts=st.integers(1, 4),
    rows=st.integers(1, 4096),
    experts=st.integers(1, 64),
    hidden=st.sampled_from([64, 1024, 7168]),
)
def test_merging_is_chosen_where_it_moves_fewer_bytes(
    parts: int, rows: int, experts: int, hidden: int
) -> None:
    inter = hidden // 4
    w13 = torch.empty(experts, hidden, 2 * inter, dtype=torch.bfloat16, device="meta")
    w2 = torch.empty(experts, inter, hidden, dtype=torch.bfloat16, device="meta")
    d = DeferredWgrad(w13=w13, w2=w2, impl="grouped")
    for _ in range(parts):
        x = torch.empty(rows, hidden, dtype=torch.bfloat16, device="meta")
        a = torch.empty(rows, inter, dtype=torch.bfloat16, device="meta")
        d.parts.append(PartRows(x=x, a=a, offsets=None, rows=rows, dh=x.new_empty(rows, 2 * inter), dy=x))
    weights = 2 * 3 * experts * hidden * inter
    moved = 4 * parts * rows * 2 * (2 * hidden + 3 * inter)
    assert d.merge_pays() == (parts > 1 and moved < 4 * (parts - 1) * weights)


@pytest.mark.slow
def test_moelab_run_records_the_deferred_weight_gradient(tmp_path: Path, db_path: Path) -> None:
    """Through the command, on gloo ranks with the grouped GEMM: tbo and expert-chunked cases pass the
    gradient check and record how the weights' gradient was computed; serial records none."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    rows = run_nccl_a2a_e2e(
        tmp_path,
        db_path,
        "wgrad",
        {"hidden": 64, "tokens_per_rank": 8, "topk": 2, "experts_per_rank": 4},
        {"mode": ["serial", "tbo", "expert"], "backward": [True], "gemm": ["grouped"], "intermediate": [64]},
        "status",
        "reason",
        "json_extract_string(backend_record, '$.e2e.mode')",
        "json_extract_string(backend_record, '$.e2e.wgrad')",
    )
    by_mode = {r[2]: r for r in rows}
    assert set(by_mode) == {"serial", "tbo", "expert"}, rows
    assert all(r[0] == "ok" for r in rows), rows
    assert by_mode["serial"][3] is None
    assert by_mode["tbo"][3] == "deferred, merged" and by_mode["expert"][3] == "deferred, merged", rows


class HookedLoopback(Loopback):
    def dispatch_hooked(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        return lambda: self.dispatch(x, topk_idx, topk_weights)


def test_hook_schedule_defers_too() -> None:
    """The hooked schedule (comm = hook) goes through the same deferral."""
    shape = (12, 4, 2, 32, 64, 1)
    want, _ = _grads("padded", lambda layer, x, i, w: layer.forward(x, i, w), *shape)
    got, how = _grads(
        "padded",
        lambda layer, x, i, w: forward_hooked(layer, x, i, w, 2, Streams(CPU), False),
        *shape,
        backend=HookedLoopback(),
    )
    assert how == "merged"
    _close(got, want, "hook")


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["grouped", "grouped-wide", "triton", "padded"])
def test_deferred_weight_gradient_on_cuda(gemm: str) -> None:
    """On one GPU (torch's CUTLASS grouped kernel, moelab's Triton one, cuBLAS's batched GEMM): tbo's merged
    weight gradient against the serial layer's, with no host sync added (tests/e2e/test_pair_counts_gpu.py
    watches). Triton: serial runs the SwiGLU fused into the first GEMM, tbo's deferred parts unfused."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda", 0)
    if gemm.startswith("grouped") and torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("torch._grouped_mm needs SM90 here")
    if gemm == "triton" and (reason := unavailable_reason(device, 256, 512)):
        pytest.skip(reason)
    experts, hidden, inter, tokens, topk = 8, 256, 512, 512, 2
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, generator=g).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(tokens, experts, device=device, generator=g), dim=1)[:, :topk]
    w = torch.rand(tokens, topk, device=device, generator=g)
    gout = torch.randn(tokens, hidden, device=device, generator=g).to(torch.bfloat16)
    got = []
    for run in ("serial", "tbo"):
        weights = local_expert_weights(0, 0, experts, hidden, inter, device, requires_grad=True)
        layer = MoELayer(Loopback(), weights, experts, gemm)
        xg = x.clone().requires_grad_(True)
        y = (
            layer.forward(xg, idx, w)
            if run == "serial"
            else forward_pipelined(layer, xg, idx, w, 2, Streams(device))
        )
        y.backward(gout)
        torch.cuda.synchronize()
        assert xg.grad is not None and weights.w13.grad is not None and weights.w2.grad is not None
        got.append(([t.float().cpu() for t in (xg.grad, weights.w13.grad, weights.w2.grad)], layer.wgrad_how))
    (serial, _), (tbo, how) = got
    assert how == "merged"
    _close(tbo, serial, gemm)
