"""The e2e layer's permute and un-permute (moelab.measure.e2e.permute) and the fused SwiGLU, forward and
backward, against a float64 statement, the old index_add path and each other, at many shapes; and the
Triton kernels themselves, run by triton's interpreter on the CPU where triton is installed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moelab.core.errors import SpecError
from moelab.core.routing import route
from moelab.core.workload import Workload
from moelab.measure.e2e import triton_kernels
from moelab.measure.e2e.activation import swiglu
from moelab.measure.e2e.layer import MoELayer, layer_tokens, local_expert_weights, output_grad
from moelab.measure.e2e.permute import PairMap, pair_map, permute, resolve_permute, unpermute
from moelab.measure.e2e.reference import layer_tolerance, reference_layer
from moelab.measure.reference import relative_error
from tests.e2e.test_e2e_layer import Loopback

BF16_ULP = 2.0**-8  # bf16's relative spacing: one rounding is within half of it


@dataclass(frozen=True)
class Received:
    idx: torch.Tensor  # [R, K] local expert ids, -1 elsewhere
    weights: torch.Tensor  # [R, K] float32
    experts: int
    hidden: int


@st.composite
def received(draw: st.DrawFn) -> Received:
    rows = draw(st.integers(0, 12))
    topk = draw(st.integers(1, 6))
    experts = draw(st.integers(1, 5))
    hidden = draw(st.integers(1, 24))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, experts, (rows, topk), generator=g)
    if draw(st.booleans()):  # slots of experts past this rank's (another rank's local ids) are ignored too
        idx = torch.where(torch.rand(rows, topk, generator=g) < 0.2, experts + 1, idx)
    weights = torch.rand(rows, topk, generator=g) + 0.01
    return Received(idx=idx, weights=weights, experts=experts, hidden=hidden)


def _values(rows: int, hidden: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, hidden, generator=g).to(torch.bfloat16)


def _local(r: Received) -> torch.Tensor:
    return (r.idx >= 0) & (r.idx < r.experts)


def _unpermute_f64(y: torch.Tensor, r: Received, m: PairMap) -> torch.Tensor:
    """out[row] = sum over the row's local slots of w * y[its pair], in float64."""
    out = torch.zeros(r.idx.shape[0], y.shape[1], dtype=torch.float64)
    local = _local(r)
    for row in range(r.idx.shape[0]):
        for k in range(r.idx.shape[1]):
            if local[row, k]:
                out[row] += float(r.weights[row, k]) * y[int(m.slot_pair[row, k])].double()
    return out


def _within_one_rounding(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(((got.double() - want).abs() <= BF16_ULP * want.abs() + 1e-6).all())


@settings(max_examples=60, deadline=None)
@given(received())
def test_pair_map_is_a_bijection_between_local_slots_and_sorted_pairs(r: Received) -> None:
    m, offsets = pair_map(r.idx, r.weights, r.experts)
    local = _local(r)
    assert m.num_pairs == int(local.sum()) == (int(offsets[-1]) if offsets.numel() else 0)
    flat = m.slot_pair.reshape(-1)
    assert torch.equal(flat >= 0, local.reshape(-1))
    assert torch.equal(flat[m.pair_slot], torch.arange(m.num_pairs))  # slot -> pair -> slot
    experts = r.idx.reshape(-1)[m.pair_slot]
    assert torch.equal(experts, experts.sort().values)  # sorted by expert, groups ending at offsets
    assert torch.equal(torch.bincount(experts, minlength=r.experts).cumsum(0).to(torch.int32), offsets)
    assert torch.equal(m.pair_row, m.pair_slot // r.idx.shape[1])
    assert torch.equal(m.slot_weight, torch.where(local, r.weights, 0.0))


@settings(max_examples=60, deadline=None)
@given(received(), st.sampled_from(["torch", "index_add"]))
def test_permute_forward_and_backward(r: Received, impl: str) -> None:
    m, _ = pair_map(r.idx, r.weights, r.experts)
    x = _values(r.idx.shape[0], r.hidden, 1).requires_grad_(True)
    pairs = permute(x, m, impl)
    assert torch.equal(pairs, x.detach()[m.pair_row])
    grad = _values(m.num_pairs, r.hidden, 2)
    pairs.backward(grad)
    assert x.grad is not None
    want = torch.zeros(x.shape, dtype=torch.float64).index_add(0, m.pair_row, grad.double())
    assert _within_one_rounding(x.grad, want) if impl == "torch" else relative_error(x.grad, want) < 0.02


@settings(max_examples=80, deadline=None)
@given(received())
def test_unpermute_against_float64_and_the_old_index_add_path(r: Received) -> None:
    """The new un-permute rounds once (float32 sums of float32-weighted pairs); the old one rounds each
    weighted pair and each partial sum to bf16: both near the float64 statement, the new one within one
    rounding of it. Its backward is each pair's row gradient times its weight, rounded once."""
    m, _ = pair_map(r.idx, r.weights, r.experts)
    y = _values(m.num_pairs, r.hidden, 3)
    want = _unpermute_f64(y, r, m)
    new = unpermute(y, m, "torch")
    assert new.dtype == torch.bfloat16 and new.shape == (r.idx.shape[0], r.hidden)
    assert _within_one_rounding(new, want)
    old = unpermute(y, m, "index_add")
    assert ((old.double() - want).abs() <= 4 * r.idx.shape[1] * BF16_ULP * (want.abs() + 1)).all()
    assert torch.equal(unpermute(y, m, "torch"), new)  # bitwise the same, run to run
    grad_out = _values(r.idx.shape[0], r.hidden, 4)
    grads = {}
    for impl in ("torch", "index_add"):
        yy = y.clone().requires_grad_(True)
        unpermute(yy, m, impl).backward(grad_out)
        assert yy.grad is not None
        grads[impl] = yy.grad
    again = y.clone().requires_grad_(True)
    unpermute(again, m, "torch").backward(grad_out)
    assert again.grad is not None and torch.equal(again.grad, grads["torch"])  # bitwise, run to run
    want_grad = grad_out.double()[m.pair_row] * m.pair_weight().double().unsqueeze(1)
    assert _within_one_rounding(grads["torch"], want_grad)
    assert _within_one_rounding(grads["index_add"], want_grad)


def test_resolve_permute() -> None:
    cpu = torch.device("cpu")
    assert resolve_permute("auto", cpu) == "torch"
    assert resolve_permute("index_add", cpu) == "index_add"
    with pytest.raises(SpecError, match="permute = triton: triton kernels run on CUDA tensors only"):
        resolve_permute("triton", cpu)
    with pytest.raises(SpecError, match="permute must be one of"):
        resolve_permute("atomic", cpu)


# --- the Triton kernels, under triton's interpreter on the CPU ---


@pytest.fixture
def interpreted() -> Iterator[None]:
    """triton's kernels on its interpreter (numpy on the CPU; tests/conftest.py turns it on without CUDA)."""
    triton = pytest.importorskip("triton")
    if not triton.knobs.runtime.interpret:
        pytest.skip(
            "triton's interpreter is on only without CUDA; test_triton_kernels_on_cuda runs them here"
        )
    triton_kernels.kernels.cache_clear()
    yield
    triton_kernels.kernels.cache_clear()


def _close_to_torch(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The interpreter rounds float32 to bf16 by truncation (the GPU rounds to nearest): one bf16 step."""
    return bool(((got.double() - want.double()).abs() <= 2 * BF16_ULP * want.double().abs() + 1e-6).all())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(received())
def test_triton_permute_and_unpermute_match_torch(interpreted: None, r: Received) -> None:
    m, _ = pair_map(r.idx, r.weights, r.experts)
    x = _values(r.idx.shape[0], r.hidden, 5)
    assert torch.equal(permute(x, m, "triton"), permute(x, m, "torch"))
    y = _values(m.num_pairs, r.hidden, 6)
    got = unpermute(y, m, "triton")
    assert _close_to_torch(got, unpermute(y, m, "torch"))
    assert torch.equal(unpermute(y, m, "triton"), got)
    grad_out = _values(r.idx.shape[0], r.hidden, 7)
    grads, xgrads = {}, {}
    for impl in ("triton", "torch"):
        yy, xx = y.clone().requires_grad_(True), x.clone().requires_grad_(True)
        unpermute(yy, m, impl).backward(grad_out)
        permute(xx, m, impl).backward(y)
        grads[impl], xgrads[impl] = yy.grad, xx.grad
    assert grads["triton"] is not None and grads["torch"] is not None
    assert _close_to_torch(grads["triton"], grads["torch"])
    assert xgrads["triton"] is not None and xgrads["torch"] is not None
    assert _close_to_torch(xgrads["triton"], xgrads["torch"])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 9), st.integers(1, 40), st.integers(0, 2**16))
def test_triton_swiglu_forward_and_backward_match_torch(
    interpreted: None, pairs: int, inter: int, seed: int
) -> None:
    h = _values(pairs, 2 * inter, seed)
    grad = _values(pairs, inter, seed + 1)
    got, want = {}, {}
    for impl, into in (("triton", got), ("torch", want)):
        hh = h.clone().requires_grad_(True)
        a = swiglu(hh, impl)
        a.backward(grad)
        into["a"], into["h"] = a.detach(), hh.grad
    exact = F.silu(h.double()[:, :inter]) * h.double()[:, inter:]
    assert _close_to_torch(got["a"], exact)
    assert relative_error(got["h"], want["h"]) < 0.02 if pairs else got["h"].shape == (0, 2 * inter)


@pytest.mark.parametrize("mode", ["serial", "tbo"])
def test_layer_with_triton_kernels_equals_reference_forward_and_backward(
    interpreted: None, mode: str
) -> None:
    """The whole layer on the kernels (permute, fused SwiGLU, un-permute) within the layer's tolerance."""
    from moelab.measure.e2e.overlap import TBO_MICRO_BATCHES, Streams, forward_pipelined

    wl = Workload(hidden=32, tokens_per_rank=12, topk=3, experts_per_rank=4)
    r = route(wl, 0, 1)
    x = layer_tokens(0, 0, 12, 32, "cpu").requires_grad_(True)
    weights = local_expert_weights(0, 0, 4, 32, 8, torch.device("cpu"), requires_grad=True)
    layer = MoELayer(Loopback(), weights, 4, "loop", permute="triton")
    if mode == "tbo":
        out = forward_pipelined(
            layer, x, r.topk_idx, r.topk_weights, TBO_MICRO_BATCHES, Streams(torch.device("cpu"))
        )
    else:
        out = layer.forward(x, r.topk_idx, r.topk_weights)
    gout = output_grad(0, 0, 12, 32, "cpu")
    out.backward(gout)
    ref = reference_layer(x.detach(), r.topk_idx, r.topk_weights, seed=0, intermediate=8, grad_out=gout)
    assert relative_error(out, ref.out) < layer_tolerance("bf16", "bf16")
    assert x.grad is not None and ref.grad_x is not None
    assert relative_error(x.grad, ref.grad_x) < 2 * layer_tolerance("bf16", "bf16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernels_on_cuda() -> None:
    """On the GPU: auto picks triton where it is installed, and its results are torch's to within a bf16
    rounding, bitwise the same run to run, forward and backward."""
    pytest.importorskip("triton")
    dev = torch.device("cuda")
    assert resolve_permute("auto", dev) == "triton"
    wl = Workload(hidden=1024, tokens_per_rank=512, topk=8, experts_per_rank=8)
    r = route(wl, 0, 1)
    m, _ = pair_map(r.topk_idx.to(dev), r.topk_weights.to(dev), 8)
    y = _values(m.num_pairs, 1024, 8).to(dev)
    got = unpermute(y, m, "triton")
    assert torch.equal(unpermute(y, m, "triton"), got)
    assert _close_to_torch(got.cpu(), unpermute(y, m, "torch").cpu())
    yy = y.clone().requires_grad_(True)
    unpermute(yy, m, "triton").backward(_values(512, 1024, 9).to(dev))
    assert yy.grad is not None
    h = _values(m.num_pairs, 2 * 512, 10).to(dev)
    assert _close_to_torch(swiglu(h, "triton").cpu(), swiglu(h, "torch").cpu())
