"""On one CUDA device, CUDA's own sync detector (torch.cuda.set_sync_debug_mode) over the overlapped layer,
forward and backward: the one synchronizing call left is the up-front read of the pair counts; the syncing
path (host_counts=False) syncs in the grouping of every micro-batch. Skipped cleanly without CUDA."""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import moelab
from moelab.measure.e2e.columns import forward_column_pipelined
from moelab.measure.e2e.layer import MoELayer, local_expert_weights
from moelab.measure.e2e.overlap import Streams, forward_expert_pipelined, forward_pipelined
from moelab.measure.e2e.permute import resolve_permute
from tests.e2e.test_e2e_layer import Loopback

pytestmark = pytest.mark.gpu

PACKAGE = str(Path(moelab.__file__).resolve().parent)
EXPERTS, HIDDEN, INTER, TOKENS, TOPK = 8, 256, 128, 512, 4


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda", 0)


def _sync_sites(run: Callable[[], None]) -> list[str]:
    """Where `run` makes a synchronizing CUDA call (the sync detector's warnings): the innermost frame in
    moelab's code of the Python stack at the warning, then the frame that warned (a torch function
    called from moelab points at torch, not at its caller: the 2 x H200 run of round 8 saw one such site
    in torch/cuda/__init__.py and could not say who called it)."""
    torch.cuda.synchronize()
    sites: list[str] = []

    def record(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, *_: object
    ) -> None:
        if "synchroniz" not in str(message):
            return
        stack = traceback.extract_stack()[:-1]
        ours = [f for f in stack if f.filename.startswith(PACKAGE)]
        if ours:
            where = f"{ours[-1].filename}:{ours[-1].lineno} ({ours[-1].name})"
        else:  # say who called: the last frames of the stack
            where = "no moelab frame: " + " > ".join(
                f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack[-4:]
            )
        sites.append(f"{where} <- {filename}:{lineno}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def _ours(module: str) -> str:
    """The start of a site in `module` of moelab.measure.e2e."""
    return str(Path(PACKAGE) / "measure" / "e2e" / module)


def _loopback_case(
    gemm: str,
) -> tuple[torch.device, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, MoELayer]:
    """A one-device layer over the loopback backend with random tokens, routing and output gradient
    (skipped without CUDA, or without the grouped kernel where `gemm` needs it)."""
    device = _cuda()
    if gemm.startswith("grouped") and (
        not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability(device) < (9, 0)
    ):
        pytest.skip("torch._grouped_mm needs SM90 here")
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, device=device, generator=g).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(TOKENS, EXPERTS, device=device, generator=g), dim=1)[:, :TOPK]
    w = torch.rand(TOKENS, TOPK, device=device, generator=g)
    gout = torch.randn(TOKENS, HIDDEN, device=device, generator=g).to(torch.bfloat16)
    weights = local_expert_weights(0, 0, EXPERTS, HIDDEN, INTER, device, requires_grad=True)
    return (
        device,
        x,
        idx,
        w,
        gout,
        MoELayer(Loopback(), weights, EXPERTS, gemm, resolve_permute("auto", device)),
    )


@pytest.mark.parametrize("mode", ["tbo", "chunked", "expert"])
@pytest.mark.parametrize("gemm", ["grouped", "grouped-wide", "triton", "padded", "loop"])
def test_overlapped_layer_syncs_only_for_the_up_front_counts(mode: str, gemm: str) -> None:
    device, x, idx, w, gout, layer = _loopback_case(gemm)
    fn = forward_expert_pipelined if mode == "expert" else forward_pipelined
    chunks = {"tbo": 2, "chunked": 3, "expert": 2}[mode]
    streams = Streams(device)

    def step(host_counts: bool) -> None:
        xg = x.detach().requires_grad_(True)
        fn(layer, xg, idx, w, chunks, streams, host_counts=host_counts).backward(gout)

    step(True)  # warm-up: kernel compilation and library initialisation may sync once
    step(False)
    # the detector's first use in the process reported one site with no moelab frame on the stack
    # (torch/cuda/__init__.py, 2 x H200, round 8), whatever ran: turned on once here, it is not counted
    _sync_sites(lambda: step(True))
    fast, slow = _sync_sites(lambda: step(True)), _sync_sites(lambda: step(False))
    # the loop's ends come from the counts too
    assert [s for s in fast if not s.startswith(_ours("pair_counts.py"))] == [], fast
    assert any(s.startswith(_ours("permute.py")) for s in slow), (
        slow
    )  # the detector sees the old per-micro-batch read


@pytest.mark.parametrize("gemm", ["grouped", "triton", "loop"])
def test_column_layer_syncs_only_for_the_up_front_counts(gemm: str) -> None:
    """Mode columns, forward and its own backward (the slices' gradient dispatches and input-gradient GEMMs
    beside each other, the weight gradient once): no sync but the up-front pair counts."""
    device, x, idx, w, gout, layer = _loopback_case(gemm)
    streams = Streams(device)

    def step() -> None:
        xg = x.detach().requires_grad_(True)
        forward_column_pipelined(layer, xg, idx, w, 4, streams).backward(gout)

    step()  # warm-up
    _sync_sites(step)  # the detector's first use is not counted (see above)
    sites = _sync_sites(step)
    assert [s for s in sites if not s.startswith(_ours("pair_counts.py"))] == [], sites
