"""Mode columns (moelab.measure.e2e.columns): the slices, the order the backend sees, and that the layer and
its gradients are the serial layer's, on one process (the gloo CLI run is in test_schedules.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from moelab.backends.deepep import DeepEPBackend
from moelab.backends.hybrid_ep import HybridEPBackend
from moelab.backends.mxfp8_a2a import Mxfp8A2ABackend
from moelab.backends.nccl_a2a import NcclA2ABackend
from moelab.backends.uccl_ep import UcclEPBackend
from moelab.core.e2e_spec import E2ESpec
from moelab.core.routing import route
from moelab.core.workload import Workload
from moelab.measure.e2e.columns import column_compute, forward_column_pipelined
from moelab.measure.e2e.layer import MoELayer, layer_tokens, local_expert_weights, output_grad
from moelab.measure.e2e.overlap import Streams
from moelab.measure.e2e.schedules import column_bounds, column_unit, schedule_reason
from tests.e2e.test_e2e_layer import PhasedLoopback

CPU = torch.device("cpu")


@given(
    units=st.integers(min_value=1, max_value=300),
    unit=st.sampled_from([8, 32, 128]),
    slices=st.integers(min_value=1, max_value=40),
)
def test_column_slices_cover_the_hidden_size_in_whole_units(units: int, unit: int, slices: int) -> None:
    bounds = column_bounds(units * unit, slices, unit)
    assert len(bounds) == min(slices, units)
    assert bounds[0][0] == 0 and bounds[-1][1] == units * unit
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous
    assert all(lo < hi and lo % unit == 0 and hi % unit == 0 for lo, hi in bounds)
    widths = [hi - lo for lo, hi in bounds]
    assert max(widths) - min(widths) <= unit  # near-equal


def test_a_hidden_size_off_the_unit_has_no_slices() -> None:
    assert column_bounds(100, 4, 8) == [] and column_bounds(0, 4, 8) == []


class Recording(PhasedLoopback):
    """Records each call with the width of the rows it moved."""

    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        self.calls.append(f"combine{expert_out.shape[1]}")
        return expert_out.detach().clone()

    def dispatch_with_handle(self, rows: torch.Tensor, handle: Any) -> torch.Tensor:
        self.calls.append(f"grad-dispatch{rows.shape[1]}")
        return super().dispatch_with_handle(rows, handle)


def _layer(backend: Any, gemm: str = "loop") -> tuple[MoELayer, torch.Tensor, Any]:
    wl = Workload(hidden=64, tokens_per_rank=24, topk=3, experts_per_rank=4)
    r = route(wl, 0, 1)
    weights = local_expert_weights(0, 0, 4, 64, 16, CPU, requires_grad=True)
    return MoELayer(backend, weights, 4, gemm), layer_tokens(0, 0, 24, 64, "cpu"), r


def test_columns_dispatches_once_and_combines_slice_by_slice_forward_and_backward() -> None:
    backend = Recording()
    layer, x, r = _layer(backend)
    xg = x.detach().requires_grad_(True)
    out = forward_column_pipelined(layer, xg, r.topk_idx, r.topk_weights, 3, Streams(CPU))
    # 64 columns in 3 slices of whole 8-column units: 16, 24, 24
    assert backend.calls == ["layout24", "dispatch24", "combine16", "combine24", "combine24"]
    backend.calls.clear()
    out.backward(output_grad(0, 0, 24, 64, "cpu"))
    # the tail's backward sends each slice's gradient along the handle; then the dispatch's backward
    # (a combine of the whole rows' gradient) runs under autograd, as in the serial layer
    assert backend.calls == ["grad-dispatch16", "grad-dispatch24", "grad-dispatch24", "combine64"]


@pytest.mark.parametrize("gemm", ["loop", "grouped"])
def test_columns_equals_the_serial_layer_and_its_gradients(gemm: str) -> None:
    if gemm == "grouped" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    layer, x, r = _layer(PhasedLoopback(), gemm)
    gout = output_grad(0, 0, 24, 64, "cpu")
    grads = []
    for run in (
        lambda xx: layer.forward(xx, r.topk_idx, r.topk_weights),
        lambda xx: forward_column_pipelined(layer, xx, r.topk_idx, r.topk_weights, 4, Streams(CPU)),
    ):
        layer.weights.zero_grad()
        xg = x.detach().requires_grad_(True)
        out = run(xg)
        out.backward(gout)
        w = layer.weights
        assert xg.grad is not None and w.w13.grad is not None and w.w2.grad is not None
        grads.append((out.detach(), xg.grad, w.w13.grad.clone(), w.w2.grad.clone()))
    for serial, columns in zip(grads[0], grads[1], strict=True):
        # the same products in another blocking: equal to bf16 rounding (the input gradient sums the
        # slices' partial products, each rounded once)
        torch.testing.assert_close(columns, serial, rtol=2e-2, atol=2e-2)
    with torch.no_grad():  # the compute_only_split op: the schedule's compute without communication
        got = layer.experts(layer.dispatch(x, r.topk_idx, r.topk_weights))
        sliced = column_compute(layer, layer.dispatch(x, r.topk_idx, r.topk_weights), 4)
    torch.testing.assert_close(sliced, got, rtol=2e-2, atol=2e-2)


def test_columns_is_the_serial_layer_when_one_slice() -> None:
    layer, x, r = _layer(PhasedLoopback())
    with torch.no_grad():
        serial = layer.forward(x, r.topk_idx, r.topk_weights)
        one = forward_column_pipelined(layer, x, r.topk_idx, r.topk_weights, 1, Streams(CPU))
    assert torch.equal(one, serial)


def _settings(**knobs: Any) -> Any:
    return E2ESpec(**knobs).resolve(Workload(hidden=7168, tokens_per_rank=64, topk=8, experts_per_rank=8))


@pytest.mark.parametrize(
    ("cls", "knobs", "hidden", "reason"),
    [
        (NcclA2ABackend, {"mode": "columns"}, 7168, None),
        (Mxfp8A2ABackend, {"mode": "columns"}, 7168, None),
        (
            HybridEPBackend,
            {"mode": "columns"},
            7168,
            "capability ColumnCombine); hybrid-ep does not declare one",
        ),
        (UcclEPBackend, {"mode": "columns"}, 7168, "capability ColumnCombine); uccl-ep does not declare one"),
        (
            NcclA2ABackend,
            {"mode": "columns", "comm": "hook"},
            7168,
            "mode columns dispatches the batch whole",
        ),
        (Mxfp8A2ABackend, {"mode": "columns"}, 7176, "multiples of 32 columns on mxfp8-a2a; hidden 7176"),
    ],
)
def test_what_columns_needs_from_a_backend(
    cls: type, knobs: dict[str, Any], hidden: int, reason: str | None
) -> None:
    got = schedule_reason(cls, _settings(**knobs), "nccl", hidden)
    assert got == reason if reason is None else (got is not None and reason in got), got


def test_columns_settings_name_the_slices() -> None:
    assert _settings(mode="columns").schedule == "columns/4"
    assert _settings(mode="columns", chunks=2).to_record("grouped")["schedule"] == "columns/2"
    tiny = E2ESpec(mode="columns", chunks=64).resolve(Workload(hidden=32, tokens_per_rank=8, topk=2))
    assert tiny.chunks == 4  # 32 columns hold four 8-column slices at most
    assert column_unit(NcclA2ABackend) == 8 and column_unit(Mxfp8A2ABackend) == 32
    assert column_unit(HybridEPBackend) == 0
    # DeepEP V1's combine faults on rows that are not whole 512-byte warp steps (896 columns, 2 x H200)
    assert column_unit(DeepEPBackend) == 256 and len(column_bounds(7168, 8, 256)) == 8
    assert all((hi - lo) % 256 == 0 for lo, hi in column_bounds(7168, 8, column_unit(DeepEPBackend)))
