"""On one CUDA device, CUDA's own sync detector (torch.cuda.set_sync_debug_mode) over the overlapped layer,
forward and backward: the one synchronizing call left is the up-front read of the pair counts; the syncing
path (host_counts=False) syncs in the grouping of every micro-batch. Skipped cleanly without CUDA."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from moelab.measure.e2e.layer import MoELayer, local_expert_weights
from moelab.measure.e2e.overlap import Streams, forward_expert_pipelined, forward_pipelined
from moelab.measure.e2e.permute import resolve_permute
from tests.e2e.test_e2e_layer import Loopback

pytestmark = pytest.mark.gpu

EXPERTS, HIDDEN, INTER, TOKENS, TOPK = 8, 256, 128, 512, 4


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda", 0)


def _sync_sites(run: Callable[[], None]) -> list[str]:
    """file:line of every synchronizing CUDA call `run` makes (the sync detector's warnings)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


@pytest.mark.parametrize("mode", ["tbo", "chunked", "expert"])
@pytest.mark.parametrize("gemm", ["grouped", "padded", "loop"])
def test_overlapped_layer_syncs_only_for_the_up_front_counts(mode: str, gemm: str) -> None:
    device = _cuda()
    if gemm == "grouped" and (
        not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability(device) < (9, 0)
    ):
        pytest.skip("torch._grouped_mm needs SM90 here")
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, device=device, generator=g).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(TOKENS, EXPERTS, device=device, generator=g), dim=1)[:, :TOPK]
    w = torch.rand(TOKENS, TOPK, device=device, generator=g)
    gout = torch.randn(TOKENS, HIDDEN, device=device, generator=g).to(torch.bfloat16)
    weights = local_expert_weights(0, 0, EXPERTS, HIDDEN, INTER, device, requires_grad=True)
    layer = MoELayer(Loopback(), weights, EXPERTS, gemm, resolve_permute("auto", device))
    fn = forward_expert_pipelined if mode == "expert" else forward_pipelined
    chunks = {"tbo": 2, "chunked": 3, "expert": 2}[mode]
    streams = Streams(device)

    def step(host_counts: bool) -> None:
        xg = x.detach().requires_grad_(True)
        fn(layer, xg, idx, w, chunks, streams, host_counts=host_counts).backward(gout)

    step(True)  # warm-up: kernel compilation and library initialisation may sync once
    step(False)
    fast, slow = _sync_sites(lambda: step(True)), _sync_sites(lambda: step(False))
    assert [s for s in fast if "pair_counts.py" not in s] == [], (
        fast
    )  # the loop's ends come from the counts too
    assert any("permute.py" in s for s in slow), slow  # the detector sees the old per-micro-batch read
