"""Single-process pieces of the e2e MoE layer: weights, grouped GEMM, grouping, reference, schedule, knobs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.backends.base import Backend, CaseConfig, Dispatched
from moelab.core.e2e_spec import E2ESpec
from moelab.core.errors import SpecError
from moelab.core.routing import route
from moelab.core.spec import CaseSpec
from moelab.core.workload import Workload
from moelab.measure.e2e.columns import forward_column_pipelined
from moelab.measure.e2e.correctness import StreamedError
from moelab.measure.e2e.layer import (
    ExpertWeights,
    MoELayer,
    expert_weight,
    group_by_expert,
    grouped_matmul,
    hashed_uniform,
    layer_tokens,
    local_expert_weights,
    output_grad,
    resolve_gemm,
    supports_backward,
    swiglu_ffn,
)
from moelab.measure.e2e.metrics import e2e_metrics
from moelab.measure.e2e.overlap import TBO_MICRO_BATCHES, Streams, chunk_bounds, forward_pipelined
from moelab.measure.e2e.permute import unpermute
from moelab.measure.e2e.reference import layer_tolerance, reference_layer
from moelab.measure.reference import relative_error
from moelab.suites.loader import expand, load_suite

HAS_GROUPED = hasattr(torch, "_grouped_mm")


def test_hashed_values_are_deterministic_and_spread() -> None:
    a = hashed_uniform(("k", 1), (1 << 16,), "cpu")
    assert torch.equal(a, hashed_uniform(("k", 1), (1 << 16,), "cpu"))
    assert not torch.equal(a, hashed_uniform(("k", 2), (1 << 16,), "cpu"))
    assert a.min() > -1 and a.max() < 1
    assert abs(a.mean().item()) < 0.01 and abs(a.var().item() - 1 / 3) < 0.01
    assert abs((a[1:] * a[:-1]).mean().item()) < 0.01  # neighbours uncorrelated
    w13, w2 = expert_weight(0, 3, 64, 16, "cpu")
    assert w13.shape == (64, 32) and w2.shape == (16, 64) and w13.dtype == torch.bfloat16
    assert abs(w13.float().std().item() - 64**-0.5) < 0.02


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hashed_values_same_bits_on_cuda() -> None:
    cpu = hashed_uniform(("k", 5), (4096, 33), "cpu")
    assert torch.equal(cpu, hashed_uniform(("k", 5), (4096, 33), "cuda").cpu())


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and HAS_GROUPED), reason="needs CUDA and torch._grouped_mm"
)
def test_grouped_ffn_on_cuda_matches_loop_forward_and_backward() -> None:
    """bf16 at a Hopper-like shape: torch's grouped kernel against one matmul per expert."""
    dev = torch.device("cuda")
    weights = local_expert_weights(0, 0, 4, 1024, 256, dev, requires_grad=True)
    x = layer_tokens(0, 0, 3000, 1024, dev).requires_grad_(True)
    offsets = torch.tensor([700, 700, 2100, 3000], dtype=torch.int32, device=dev)
    got: list[tuple[torch.Tensor, ...]] = []
    for impl in ("grouped", "loop"):
        weights.zero_grad()
        x.grad = None
        y = swiglu_ffn(x, offsets, weights, impl)
        y.backward(output_grad(0, 0, 3000, 1024, dev))
        assert x.grad is not None and weights.w13.grad is not None and weights.w2.grad is not None
        got.append((y.detach(), x.grad.clone(), weights.w13.grad.clone(), weights.w2.grad.clone()))
    assert resolve_gemm("auto", dev, 1024, 256) == (
        "grouped" if torch.cuda.get_device_capability() >= (9, 0) else "loop"
    )
    for a, b in zip(got[0], got[1], strict=True):
        assert relative_error(a, b) < 1e-2


def _loop_reference(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    outs, start = [], 0
    for g, n in enumerate(sizes):
        outs.append(x[start : start + n].double() @ w[g].double())
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["loop", "grouped"])
def test_grouped_matmul_matches_per_group_matmuls(impl: str, dtype: torch.dtype) -> None:
    if impl == "grouped" and not HAS_GROUPED:
        pytest.skip("torch has no _grouped_mm")
    gen = torch.Generator().manual_seed(0)
    sizes = [5, 0, 9, 2]  # an empty group in the middle
    x = torch.randn(sum(sizes), 24, generator=gen).to(dtype)
    w = torch.randn(len(sizes), 24, 16, generator=gen).to(dtype)
    offsets = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    got = grouped_matmul(x, w, offsets, impl)
    assert got.shape == (16, 16)
    assert relative_error(got, _loop_reference(x, w, sizes)) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.skipif(not HAS_GROUPED, reason="torch has no _grouped_mm")
def test_grouped_and_loop_ffn_agree_with_gradients() -> None:
    weights = local_expert_weights(0, 0, 3, 32, 8, torch.device("cpu"), requires_grad=True)
    x = layer_tokens(0, 0, 20, 32, "cpu").float().requires_grad_(True)
    offsets = torch.tensor([7, 7, 20], dtype=torch.int32)
    w32 = ExpertWeights(
        w13=weights.w13.detach().float().requires_grad_(),
        w2=weights.w2.detach().float().requires_grad_(),
        first_expert=0,
    )
    grads: list[tuple[torch.Tensor, ...]] = []
    for impl in ("grouped", "loop"):
        w32.zero_grad()
        x.grad = None
        y = swiglu_ffn(x, offsets, w32, impl)
        y.backward(torch.ones_like(y))
        assert x.grad is not None and w32.w13.grad is not None
        grads.append((y.detach(), x.grad.clone(), w32.w13.grad.clone()))
    for a, b in zip(grads[0], grads[1], strict=True):
        assert relative_error(a, b) < 1e-5


def test_resolve_gemm() -> None:
    cpu = torch.device("cpu")
    assert resolve_gemm("auto", cpu, 64, 16) == "loop"  # grouped is for Hopper's CUTLASS kernel
    assert resolve_gemm("loop", cpu, 64, 16) == "loop"
    with pytest.raises(SpecError, match="gemm must be one of"):
        resolve_gemm("cublas", cpu, 64, 16)
    if HAS_GROUPED:
        assert resolve_gemm("grouped", cpu, 64, 16) == "grouped"


def test_grouping_replicates_rows_per_local_expert_and_sums_back() -> None:
    recv_idx = torch.tensor([[1, -1, 0], [-1, -1, 2], [2, 1, -1], [-1, -1, -1]])
    recv_w = torch.tensor(
        [[0.5, 0.0, 0.25], [0.0, 0.0, 1.0], [0.75, 0.125, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64
    )
    x = torch.arange(4 * 2, dtype=torch.float32).view(4, 2) + 1
    g = group_by_expert(x, recv_idx, recv_w, 3)
    assert g.offsets.tolist() == [1, 3, 5] and g.offsets.dtype == torch.int32
    assert g.map.pair_row.tolist() == [
        0,
        0,
        2,
        1,
        2,
    ]  # expert 0: row 0; expert 1: rows 0, 2; expert 2: rows 1, 2
    assert g.map.slot_pair.tolist() == [[1, -1, 0], [-1, -1, 3], [4, 2, -1], [-1, -1, -1]]
    assert torch.equal(g.x, x[g.map.pair_row])
    # per-expert function e -> (e + 1) * x, weighted and summed per row
    scale = torch.repeat_interleave(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 2, 2]))
    out = unpermute(g.x * scale.unsqueeze(1), g.map, "torch")
    want = torch.stack(
        [(0.5 * 2 + 0.25 * 1) * x[0], 1.0 * 3 * x[1], (0.75 * 3 + 0.125 * 2) * x[2], torch.zeros(2)]
    )
    assert torch.allclose(out, want)


def _naive_layer(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, seed: int, inter: int) -> torch.Tensor:
    """Token by token, slot by slot, in float64: an independent statement of the layer."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            w13, w2 = (m.double() for m in expert_weight(seed, int(idx[t, k]), x.shape[1], inter, "cpu"))
            h = x[t].double() @ w13
            out[t] += w[t, k].double() * ((F.silu(h[:inter]) * h[inter:]) @ w2)
    return out


def test_reference_layer_matches_token_by_token_statement() -> None:
    wl = Workload(hidden=32, tokens_per_rank=12, topk=3, experts_per_rank=2)
    r = route(wl, 0, 4)
    x = layer_tokens(1, 0, 12, 32, "cpu")
    ref = reference_layer(x, r.topk_idx, r.topk_weights, seed=1, intermediate=8)
    assert relative_error(ref.out, _naive_layer(x, r.topk_idx, r.topk_weights, 1, 8)) < 1e-5


def test_reference_gradients_match_autograd_of_naive_layer() -> None:
    wl = Workload(hidden=16, tokens_per_rank=6, topk=2, experts_per_rank=1)
    r = route(wl, 0, 3)
    x = layer_tokens(2, 0, 6, 16, "cpu")
    gout = output_grad(2, 0, 6, 16, "cpu")
    ref = reference_layer(
        x, r.topk_idx, r.topk_weights, seed=2, intermediate=4, grad_out=gout, experts=[0, 1, 2]
    )
    x64 = x.double().requires_grad_(True)
    w = {e: [m.double().requires_grad_(True) for m in expert_weight(2, e, 16, 4, "cpu")] for e in range(3)}
    out = torch.zeros(6, 16, dtype=torch.float64)
    for t in range(6):
        for k in range(2):
            w13, w2 = w[int(r.topk_idx[t, k])]
            h = x64[t] @ w13
            out[t] = out[t] + r.topk_weights[t, k].double() * ((F.silu(h[:4]) * h[4:]) @ w2)
    out.backward(gout.double())
    assert ref.grad_x is not None and x64.grad is not None
    assert relative_error(ref.grad_x, x64.grad) < 1e-5
    for e in range(3):
        g13, g2 = w[e][0].grad, w[e][1].grad
        assert g13 is not None and g2 is not None
        assert relative_error(ref.grad_w13[e], g13) < 1e-5
        assert relative_error(ref.grad_w2[e], g2) < 1e-5
    # only the named experts contribute
    part = reference_layer(x, r.topk_idx, r.topk_weights, seed=2, intermediate=4, experts=[1])
    assert set(part.grad_w13) == set() and not torch.equal(part.out, ref.out)
    # streamed: each expert's weight gradients go to the callback, the same values, none kept
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    streamed = reference_layer(
        x,
        r.topk_idx,
        r.topk_weights,
        seed=2,
        intermediate=4,
        grad_out=gout,
        experts=[0, 1, 2],
        on_weight_grads=lambda e, g13, g2: seen.__setitem__(e, (g13, g2)),
    )
    assert not streamed.grad_w13 and not streamed.grad_w2 and sorted(seen) == [0, 1, 2]
    for e in range(3):
        assert torch.equal(seen[e][0], ref.grad_w13[e]) and torch.equal(seen[e][1], ref.grad_w2[e])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=5),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 1e-3, 0.3]),
)
def test_a_streamed_error_is_the_relative_error_of_the_concatenation(
    sizes: list[int], seed: int, noise: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    wants = [torch.randn(n, generator=gen) for n in sizes]
    gots = [(w + noise * torch.randn(w.shape, generator=gen)).bfloat16() for w in wants]
    streamed = StreamedError()
    for got, want in zip(gots, wants, strict=True):
        streamed.add(got, want)
    whole = relative_error(torch.cat(gots), torch.cat(wants))
    assert streamed.value() == pytest.approx(whole, rel=1e-9, abs=1e-12)
    gots[0][0] = float("nan")
    broken = StreamedError()
    for got, want in zip(gots, wants, strict=True):
        broken.add(got, want)
    assert broken.value() == float("inf") == relative_error(torch.cat(gots), torch.cat(wants))


class LoopbackForwardOnly(Backend):
    """One rank holding every expert: dispatch hands the tokens to itself, combine hands them back."""

    name = "test-loopback"

    def __init__(self) -> None:  # no context: nothing to communicate
        pass

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        return Dispatched(
            recv_x=x.detach().clone(),
            recv_topk_idx=topk_idx,
            recv_topk_weights=topk_weights,
            handle=x.shape[0],
        )

    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        assert expert_out.shape[0] == handle
        return expert_out.detach().clone()


class Loopback(LoopbackForwardOnly):
    column_unit = 8  # ColumnCombine: hands back rows of any width

    def dispatch_with_handle(self, rows: torch.Tensor, handle: Any) -> torch.Tensor:
        assert rows.shape[0] == handle
        return rows.detach().clone()


class PhasedLoopback(Loopback):
    """Loopback with the layout step split from the payload (Backend.phases): records the call order."""

    phases = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        self.calls.append(f"layout{topk_idx.shape[0]}")
        return ("layout", topk_idx.shape[0])

    def dispatch(  # type: ignore[override]
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        # without a layout the backend computes its own (the serial layer); with one, the micro-batch's
        assert layout in (None, ("layout", x.shape[0])), "the schedule passes each micro-batch its own layout"
        self.calls.append(f"dispatch{x.shape[0]}" + ("" if layout else "-fresh"))
        return super().dispatch(x, topk_idx, topk_weights)

    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        self.calls.append(f"combine{handle}")
        return super().combine(expert_out, handle)


def test_tbo_computes_each_layout_once_before_any_payload() -> None:
    wl = Workload(hidden=32, tokens_per_rank=10, topk=2, experts_per_rank=3)
    r = route(wl, 0, 1)
    backend = PhasedLoopback()
    layer = MoELayer(backend, local_expert_weights(0, 0, 3, 32, 8, torch.device("cpu")), 3, "loop")
    x = layer_tokens(0, 0, 10, 32, "cpu")
    with torch.no_grad():
        out = forward_pipelined(
            layer, x, r.topk_idx, r.topk_weights, TBO_MICRO_BATCHES, Streams(torch.device("cpu"))
        )
        serial = layer.forward(x, r.topk_idx, r.topk_weights)
    # the pipeline order: both layouts, A's dispatch, B's dispatch (under A's experts), A's combine, B's
    assert backend.calls[:6] == ["layout5", "layout5", "dispatch5", "dispatch5", "combine5", "combine5"]
    assert torch.equal(out, serial)


@pytest.mark.parametrize("mode", ["serial", "tbo", "chunked", "columns"])
@pytest.mark.parametrize("gemm", ["loop", "grouped"])
def test_layer_on_one_rank_equals_reference_forward_and_backward(mode: str, gemm: str) -> None:
    if gemm == "grouped" and not HAS_GROUPED:
        pytest.skip("torch has no _grouped_mm")
    wl = Workload(hidden=64, tokens_per_rank=40, topk=3, experts_per_rank=5)
    r = route(wl, 0, 1)
    x = layer_tokens(0, 0, 40, 64, "cpu")
    weights = local_expert_weights(0, 0, 5, 64, 16, torch.device("cpu"), requires_grad=True)
    layer = MoELayer(Loopback(), weights, 5, gemm)
    streams = Streams(torch.device("cpu"))

    def forward(xx: torch.Tensor) -> torch.Tensor:
        if mode == "tbo":
            return forward_pipelined(layer, xx, r.topk_idx, r.topk_weights, TBO_MICRO_BATCHES, streams)
        if mode == "chunked":
            return forward_pipelined(layer, xx, r.topk_idx, r.topk_weights, 3, streams)
        if mode == "columns":
            return forward_column_pipelined(layer, xx, r.topk_idx, r.topk_weights, 4, streams)
        return layer.forward(xx, r.topk_idx, r.topk_weights)

    with torch.no_grad():
        out = forward(x)
    gout = output_grad(0, 0, 40, 64, "cpu")
    ref = reference_layer(x, r.topk_idx, r.topk_weights, seed=0, intermediate=16, grad_out=gout)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    err = relative_error(out, ref.out)
    assert err < layer_tolerance("bf16", "bf16")
    xg = x.detach().requires_grad_(True)
    forward(xg).backward(gout)
    assert (
        xg.grad is not None
        and ref.grad_x is not None
        and weights.w13.grad is not None
        and weights.w2.grad is not None
    )
    assert relative_error(xg.grad, ref.grad_x) < 2 * layer_tolerance("bf16", "bf16")
    assert relative_error(weights.w13.grad, torch.stack([ref.grad_w13[e] for e in range(5)])) < 0.04
    assert relative_error(weights.w2.grad, torch.stack([ref.grad_w2[e] for e in range(5)])) < 0.04


def test_wrong_weights_are_caught_by_the_reference() -> None:
    """The check can fail: a layer built with another seed's experts is far outside the tolerance."""
    wl = Workload(hidden=64, tokens_per_rank=16, topk=2, experts_per_rank=4)
    r = route(wl, 0, 1)
    x = layer_tokens(0, 0, 16, 64, "cpu")
    layer = MoELayer(Loopback(), local_expert_weights(1, 0, 4, 64, 16, torch.device("cpu")), 4, "loop")
    with torch.no_grad():
        out = layer.forward(x, r.topk_idx, r.topk_weights)
    ref = reference_layer(x, r.topk_idx, r.topk_weights, seed=0, intermediate=16)
    assert relative_error(out, ref.out) > 10 * layer_tolerance("bf16", "bf16")


def test_backward_needs_dispatch_with_handle() -> None:
    assert supports_backward(Loopback()) is None
    reason = supports_backward(LoopbackForwardOnly())
    assert reason is not None and "dispatch_with_handle" in reason


def test_chunk_bounds_cover_every_token_once() -> None:
    assert chunk_bounds(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2)]
    assert chunk_bounds(7, 1) == [(0, 7)]


def test_settings_from_knobs() -> None:
    wl = Workload(hidden=8192)
    s = E2ESpec.from_knobs({"bench": "e2e"}).resolve(wl)
    assert (s.mode, s.chunks, s.intermediate, s.backward, s.gemm) == ("serial", 1, 2048, False, "auto")
    s = E2ESpec.from_knobs({"mode": "chunked", "intermediate": 512, "backward": True}).resolve(wl)
    assert (s.mode, s.chunks, s.intermediate, s.backward) == ("chunked", 4, 512, True)
    s = E2ESpec.from_knobs({"mode": "tbo"}).resolve(wl)
    assert (s.mode, s.chunks) == ("tbo", 2)
    for knobs, match in (
        ({"mode": "pipelined"}, "mode must be one of"),
        ({"mode": "overlap"}, "renamed"),
        ({"mode": "serial", "chunks": 2}, "needs mode = chunked"),
        ({"mode": "tbo", "chunks": 3}, "needs mode = chunked"),
        ({"mode": "chunked", "chunks": 0}, "positive integer"),
        ({"intermediate": 3.5}, "positive integer"),
        ({"backward": "yes"}, "true or false"),
        ({"gemm": "cublas"}, "gemm must be one of"),
    ):
        with pytest.raises(SpecError, match=match):
            E2ESpec.from_knobs(knobs).resolve(wl)


def test_backend_sees_only_its_own_knobs() -> None:
    knobs = {"bench": "e2e", "mode": "chunked", "chunks": 2, "combine_impl": "bf16"}
    case = CaseSpec.from_asked(knobs=knobs, case_id="c", backend="mxfp8-a2a", workload=Workload(), sms=16)
    assert case.kind == "e2e" and case.e2e == E2ESpec(mode="chunked", chunks=2)
    assert case.knobs == {"combine_impl": "bf16"}
    assert case.asked_knobs() == knobs  # the store and spec.json keep the knobs as the suite wrote them
    assert CaseSpec.from_dict(case.to_dict()) == case
    plain = CaseSpec.from_asked(
        knobs={"combine_impl": "bf16"}, case_id="d", backend="mxfp8-a2a", workload=Workload()
    )
    assert plain.kind == "a2a" and plain.e2e is None
    cfg = CaseConfig.of(case)
    assert cfg.knobs == {"combine_impl": "bf16"} and cfg.sms == 16 and cfg.case_id == "c"
    with pytest.raises(SpecError, match="unknown bench 'layer'"):
        CaseSpec.from_asked(knobs={"bench": "layer"}, case_id="e", backend="nccl-a2a", workload=Workload())
    with pytest.raises(SpecError, match="an e2e case carries e2e settings"):
        CaseSpec(case_id="f", backend="nccl-a2a", workload=Workload(), kind="e2e")


def _ops(**medians: float) -> dict[str, dict[str, Any]]:
    return {op: {"samples_us": [[m, m], [m - 1, m]], "bytes_per_row": 0} for op, m in medians.items()}


def test_metrics_definitions() -> None:
    wl = Workload(hidden=8, tokens_per_rank=1000)
    settings = E2ESpec.from_knobs({"mode": "tbo", "intermediate": 4}).resolve(wl)
    ops = _ops(
        layer=500.0,
        layer_serial=700.0,
        compute_only=300.0,
        compute_only_split=330.0,
        gemm=200.0,
        gemm_mb=100.0,
        gemm_mb_under_comm=125.0,
        dispatch=150.0,
        combine=150.0,
    )
    m = {d["name"]: d for d in e2e_metrics(ops, settings, wl, [1000, 3000], {"layer_err": 0.004})}
    assert m["tokens_per_s_per_rank"]["value"] == pytest.approx(1000 / 500e-6)
    assert m["exposed_comm_us"]["value"] == pytest.approx(200.0)
    assert m["exposed_comm_share"]["value"] == pytest.approx(0.4)
    assert m["overlap_efficiency"]["value"] == pytest.approx((300 - 200) / 300)
    assert m["speedup_vs_serial"]["value"] == pytest.approx(700 / 500)
    assert m["split_overhead_us"]["value"] == pytest.approx(30.0)
    assert m["gemm_slowdown"]["value"] == pytest.approx(0.25)
    assert m["gemm_tflops_per_rank"]["value"] == pytest.approx(6 * 2000 * 8 * 4 / 200e-6 / 1e12)
    assert m["layer_rel_err"]["value"] == 0.004
    assert all(set(d) == {"name", "value", "unit", "definition"} and d["definition"] for d in m.values())
    serial = E2ESpec.from_knobs({}).resolve(wl)
    by_name = {
        d["name"]: d["value"]
        for d in e2e_metrics(
            _ops(layer=5.0, compute_only=2.0, gemm=1.0, gemm_mb=1.0, gemm_mb_under_comm=1.0, dispatch=1.5,
                 combine=1.5),
            serial, wl, [1], {},
        )
    }  # fmt: skip
    assert "speedup_vs_serial" not in by_name and "layer_rel_err" in by_name
    assert by_name["overlap_efficiency"] == pytest.approx(0.0)  # serial: nothing hidden


LAYER_METRICS = ["layer_us", "tokens_per_s_per_rank"]
COMM_METRICS = ["comm_us", "exposed_comm_us", "exposed_comm_share", "overlap_efficiency", "gemm_tflops_per_rank",
                "gemm_slowdown"]  # fmt: skip
SPLIT = [
    "sms_taken_from_gemms",
    "speedup_vs_serial",
    "serial_exposed_comm_share",
    "split_overhead_us",
    "split_overhead_share",
    "schedule_overhead_us",
]
ROOFLINE = [
    "dense_matmul_tflops",
    "dense_matmul_sustained_tflops",
    "gemm_share_of_sustained_matmul",
    "hbm_copy_gbps",
    "gemm_roofline_share",
    "permute_over_floor",
    "compute_roofline_us",
    "compute_roofline_share",
    "roofline_us",
    "roofline_share",
]
ROOFLINE_FWD_BWD = ["roofline_us_fwd_bwd", "roofline_share_fwd_bwd"]


@pytest.mark.parametrize(
    ("knobs", "names"),
    [
        ({}, [*LAYER_METRICS, *COMM_METRICS, "layer_rel_err", *ROOFLINE]),
        ({"mode": "chunked"}, [*LAYER_METRICS, *COMM_METRICS, "layer_rel_err", *SPLIT, *ROOFLINE]),
        ({"backward": True}, [*LAYER_METRICS, *COMM_METRICS, "layer_rel_err", "tokens_per_s_per_rank_fwd_bwd",
                              "grad_x_rel_err", "grad_w_rel_err", *ROOFLINE, *ROOFLINE_FWD_BWD]),
        ({"mode": "tbo", "backward": True}, [*LAYER_METRICS, *COMM_METRICS, "layer_rel_err", *SPLIT,
                                             "tokens_per_s_per_rank_fwd_bwd", "grad_x_rel_err",
                                             "grad_w_rel_err", "speedup_vs_serial_fwd_bwd", *ROOFLINE,
                                             *ROOFLINE_FWD_BWD]),
        ({"profile": "layer"}, [*LAYER_METRICS, "layer_rel_err"]),
        ({"mode": "tbo", "profile": "layer", "backward": True},
         [*LAYER_METRICS, "layer_rel_err", "tokens_per_s_per_rank_fwd_bwd"]),
    ],
)  # fmt: skip
def test_metrics_per_settings_in_stored_order(knobs: dict[str, Any], names: list[str]) -> None:
    """Which metrics a case stores, and in which order, follows its settings alone; a zero time gives None."""
    wl = Workload(hidden=8, tokens_per_rank=1000)
    settings = E2ESpec.from_knobs({"intermediate": 4, **knobs}).resolve(wl)
    ops = _ops(**{op: 0.0 for op in ("layer", "layer_serial", "compute_only", "compute_only_split", "gemm", "gemm_mb",
                                     "gemm_mb_under_comm", "dispatch", "combine", "layer_fwd_bwd",
                                     "layer_fwd_bwd_serial")})  # fmt: skip
    got = e2e_metrics(ops, settings, wl, [0, 0], {})
    assert [m["name"] for m in got] == names
    by_name = {m["name"]: m for m in got}
    assert by_name["tokens_per_s_per_rank"]["value"] is None and by_name["layer_rel_err"]["value"] is None
    assert f"({settings.mode})" in by_name["layer_us"]["definition"]
    if "split_overhead_us" in by_name:
        assert (
            by_name["split_overhead_us"]["definition"]
            == f"expert compute in {settings.chunks} micro-batches - in one"
        )


def test_e2e_suite_expands_into_e2e_cases_for_every_listed_backend() -> None:
    suite = load_suite("e2e")
    cases = expand(suite, ["nccl-a2a", "mxfp8-a2a", "deepep"], world=2, overrides={"experts_per_rank": [8]})
    assert cases and all(c.kind == "e2e" and c.e2e is not None for c in cases)
    nccl = [c for c in cases if c.backend == "nccl-a2a"]
    assert {(c.e2e.mode if c.e2e else None, c.sms) for c in nccl} == {
        (m, s) for m in ("serial", "tbo") for s in (None, 16, 24, 32)
    }
    assert all(c.skip_reason is None and c.workload.hidden == 8192 and c.workload.topk == 8 for c in cases)
    for c in cases:
        assert c.e2e is not None
        c.e2e.resolve(c.workload)
    assert len({(c.backend, c.case_id) for c in cases}) == len(cases)


def test_bench_a2a_crossing_the_layer_axes_is_one_plain_dispatch_combine_case() -> None:
    """`bench = ["a2a", "e2e"]` runs both benchmarks in one job per backend: the e2e knobs cross only the
    layer's cases, and the dispatch/combine case keeps the id and knobs it has without the axis."""
    from moelab.suites.loader import expand, parse_suite

    suite = parse_suite(
        {
            "name": "mix",
            "workload": {"hidden": 256, "tokens_per_rank": 64, "topk": 8, "experts_per_rank": 8},
            "backend": {
                "nccl-a2a": {"axes": {"bench": ["a2a", "e2e"], "mode": ["serial", "tbo"], "backward": [True]}}
            },
        }
    )
    cases = expand(suite, ["nccl-a2a"], world=2)
    a2a = [c for c in cases if c.kind == "a2a"]
    assert (
        len(a2a) == 1
        and a2a[0].knobs == {}
        and "bench" not in a2a[0].case_id
        and "mode" not in a2a[0].case_id
    )
    assert sorted(c.e2e.mode for c in cases if c.kind == "e2e") == ["serial", "tbo"]
    with pytest.raises(SpecError, match="unknown bench 'layer': a2a .dispatch/combine. or e2e"):
        expand(
            parse_suite({"name": "x", "backend": {"nccl-a2a": {"axes": {"bench": ["layer"]}}}}),
            ["nccl-a2a"],
            2,
        )


class GemmSpy(MoELayer):
    """A layer that notes the GEMM implementation of each expert compute, and the batch's pairs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, int]] = []

    def ffn(self, g: Any) -> torch.Tensor:
        self.seen.append((self.gemm, g.num_pairs))
        return super().ffn(g)


def test_parts_run_their_own_gemm_and_the_serial_layer_the_whole_batch_one() -> None:
    """gemm = auto chooses the whole batch's and the parts' implementations apart (moelab.measure.e2e.bench
    settle_gemm): inside `parts()` (an overlapped forward, the split compute) the layer runs part_gemm,
    outside it the whole batch's, and the choice changes no value."""
    from moelab.core.e2e_spec import E2ESettings
    from moelab.measure.e2e.correctness import LayerInputs
    from moelab.measure.e2e.overlap import compute_chunked

    wl = Workload(hidden=32, tokens_per_rank=12, topk=2, experts_per_rank=3)
    r = route(wl, 0, 1)
    layer = GemmSpy(Loopback(), local_expert_weights(0, 0, 3, 32, 8, torch.device("cpu")), 3, "loop")
    x = layer_tokens(0, 0, 12, 32, "cpu")
    streams = Streams(torch.device("cpu"))
    with torch.no_grad():
        serial = layer.forward(x, r.topk_idx, r.topk_weights)
        layer.part_gemm = "padded"
        with layer.parts():
            tbo = forward_pipelined(layer, x, r.topk_idx, r.topk_weights, TBO_MICRO_BATCHES, streams)
        assert layer.gemm == "loop"  # restored
        again = layer.forward(x, r.topk_idx, r.topk_weights)
        halves = [
            layer.dispatch(x[a:b], r.topk_idx[a:b], r.topk_weights[a:b]) for a, b in chunk_bounds(12, 2)
        ]
        compute_chunked(layer, halves)
        # the case's forward: the overlapped layer in the parts' GEMM, the serial one it is compared with not
        settings = E2ESettings(mode="tbo", chunks=2, intermediate=8, backward=False, gemm="auto")
        inputs = LayerInputs(
            routings=[r], topk_idx=r.topk_idx, topk_weights=r.topk_weights, x=x, weights=layer.weights,
            layer=layer, streams=streams, settings=settings, gemm="loop", permute="torch",
        )  # fmt: skip
        inputs.forward(x)
        inputs.serial_forward(x)
    whole = 12 * 2
    assert [g for g, _ in layer.seen[6:]] == ["padded", "padded", "loop"]
    assert [g for g, _ in layer.seen[:6]] == ["loop", "padded", "padded", "loop", "padded", "padded"]
    assert [p for _, p in layer.seen][0] == whole and all(p < whole for _, p in layer.seen[1:3])
    torch.testing.assert_close(tbo.float(), serial.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(again, serial)
