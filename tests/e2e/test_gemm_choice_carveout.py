"""gemm = auto chooses the overlapped layer's part GEMM under the carve-out that layer launches it with
(moelab.measure.e2e.bench.settle_gemm): held to fewer SMs, torch's and moelab's kernels lose by different
amounts (on one H200, DeepSeek-V3's EP = 4 shape with 8 SMs held back: moelab's Triton kernel, persistent,
+28%, torch's CUTLASS kernel +0%), so a choice timed on the whole GPU can pick the slower one for the
layer it runs in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from moelab.measure.e2e import bench
from moelab.measure.e2e.carveout import held_sms
from moelab.measure.e2e.gemm_choice import GemmChoice


@dataclass
class _Layer:
    gemm: str = "grouped"
    part_gemm: str | None = None
    experts_per_rank: int = 4

    def dispatch(self, x: Any, idx: Any, w: Any) -> Any:
        return SimpleNamespace(grouped=("grouped rows", x))

    @contextlib.contextmanager
    def parts(self) -> Iterator[None]:
        yield

    def ffn(self, g: Any) -> None:
        return None


@dataclass
class _Inputs:
    """The fields of LayerInputs settle_gemm reads, on a device it takes for a GPU."""

    settings: Any
    layer: _Layer = field(default_factory=_Layer)
    x: Any = field(default_factory=lambda: SimpleNamespace(is_cuda=True, shape=(0, 64)))
    topk_idx: Any = None
    topk_weights: Any = None
    gemm: str = "grouped"

    @property
    def carveout(self) -> int:  # as LayerInputs.carveout on a GPU: the case's
        return int(self.settings.carveout)

    @contextlib.contextmanager
    def carved(self) -> Iterator[None]:  # as LayerInputs.carved: the case's carve-out, restored after
        previous = torch._C._get_sm_carveout_experimental()
        torch._C._set_sm_carveout_experimental(self.settings.carveout or None)
        try:
            yield
        finally:
            torch._C._set_sm_carveout_experimental(previous)


@pytest.mark.parametrize("carveout", [0, 8])
def test_the_parts_gemm_is_chosen_under_the_layers_carve_out(
    carveout: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole batch's choice (the serial layer's GEMMs) is timed on every SM, the parts' under the
    carve-out, and the record says which carve-out the parts' trials ran under."""
    held_at_choice: list[int] = []

    def choose(layer: Any, batches: Any, group: Any, world: int) -> GemmChoice:
        held_at_choice.append(held_sms())
        return GemmChoice(
            impl="grouped" if len(held_at_choice) == 1 else "triton", trials_us={"grouped": 1.0}
        )

    monkeypatch.setattr(bench, "choose_gemm", choose)
    monkeypatch.setattr(bench, "gemm_kernels", lambda fn: [])
    monkeypatch.setattr(
        bench, "schedule_parts", lambda *a: [SimpleNamespace(x=1, topk_idx=2, topk_weights=3)] * 2
    )
    settings = SimpleNamespace(gemm="auto", mode="tbo", chunks=2, carveout=carveout, intermediate=32)
    inputs = _Inputs(settings=settings)
    ctx = SimpleNamespace(group=None, world=4)
    out, record = bench.settle_gemm(inputs, ctx)  # type: ignore[arg-type]
    assert held_at_choice == [0, carveout]  # whole batch on every SM, parts under the carve-out
    assert held_sms() == 0  # restored
    assert record["gemm_part"] == "triton" and record["gemm_part_carveout"] == carveout
    assert out.gemm == "grouped" and inputs.layer.part_gemm == "triton"
