"""The expert GEMMs as moelab's own Triton grouped GEMM (`gemm = triton`; kernel and why it is faster in
moelab.measure.e2e.grouped_gemm_jit), forward and backward.

Forward and the input gradient run the Triton kernel (the input gradient on the weights transposed, read
in place); the weight gradient is torch._grouped_mm's reduction over each group's rows
(moelab.measure.e2e.wgrad.grouped_wgrad), as for `gemm = grouped`. The grid needs the largest group's
rows, which the grouping reads in the same host sync as the pair count (PairMap.max_group): no sync here.
Under the GEMM carve-out of an overlapped layer (moelab.measure.e2e.carveout) the kernel runs persistent
on the SMs left to it (`programs`), so the communication beside it has its SMs while it runs.

triton is imported on first use, never at import; `unavailable_reason` says why a case cannot take this
path (no CUDA, no triton or no TMA, rows not 16-byte aligned), and `gemm = triton` is refused with it
before any kernel runs. Setting triton's interpreter (TRITON_INTERPRET=1) runs the kernel on the CPU, which
is how the tests check it (in float16 and float32: the interpreter's bfloat16 dot is wrong).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from moelab.measure.e2e import triton_kernels
from moelab.measure.e2e.activation import swiglu
from moelab.measure.e2e.carveout import held_sms
from moelab.measure.e2e.wgrad import grouped_wgrad

# BLOCK_M, BLOCK_N, BLOCK_K of the descriptors a tuned launch is given; each tuned config's pre_hook sets its
# own (grouped_gemm_jit.PLAIN_TUNED, SWIGLU_TUNED)
BLOCKS = (128, 256, 64)
SWIGLU_BLOCKS = (128, 128, 64)  # the fused first GEMM: 128 gate and 128 up columns per tile
INTERPRETED_BLOCKS = (32, 32, 16)  # under triton's interpreter (CPU tests)
INTERPRETED_SWIGLU_BLOCKS = (32, 16, 16)
INTERPRETED_OPTIONS = {"HALF_TAIL": True}  # the interpreter runs the plain kernel: no autotuned options
ALIGN = 8  # TMA: every stride but the last a multiple of 16 bytes (8 bf16 elements)
INTERPRETED_SMS = 4  # the SMs the interpreter stands in for (CPU tests of the carve-out's persistent grid)


def programs(tiles: int, sms: int, held: int) -> int:
    """The grid of a launch of `tiles` output tiles on a GPU of `sms` SMs with `held` of them carved out for
    the communication: one program per tile without a carve-out (the whole GPU, as torch's GEMMs), else
    one per SM left (at least one), each taking the next tile until none is left."""
    if held <= 0:
        return tiles
    return max(1, min(tiles, sms - held))


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETED_SMS
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.cache
def _idle_counter(device: torch.device) -> torch.Tensor:
    """The counter argument of a launch that runs one program per tile and never reads it (the autotuner may
    zero it while it times configurations: it is nobody's data)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


@functools.cache
def _jit() -> ModuleType:
    return importlib.import_module("moelab.measure.e2e.grouped_gemm_jit")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _tma_reason() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        importlib.import_module("triton.tools.tensor_descriptor")
    except ImportError:
        return "this triton has no tensor descriptors (TMA; triton >= 3.4)"
    return None


def unavailable_reason(device: torch.device, hidden: int, intermediate: int) -> str | None:
    """None where the layer's GEMMs can run this kernel, else why not."""
    reason = _tma_reason()
    if reason is not None:
        return reason
    if device.type != "cuda":  # its CPU interpreter runs the tests, but its bfloat16 dot is wrong
        return "the Triton grouped GEMM runs on CUDA only"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return "the Triton grouped GEMM reads through TMA descriptors: SM90 (Hopper) or newer"
    if hidden % ALIGN or intermediate % ALIGN:
        return f"hidden and intermediate must be multiples of {ALIGN} (TMA wants 16-byte aligned rows)"
    return None


@dataclass(frozen=True, slots=True)
class TileConfig:
    """One launch configuration of the kernel, fixed instead of autotuned: what
    benchmarks/triton_gemm_tiles.py sweeps to find the tile shapes worth tuning over."""

    blocks: tuple[int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K (BLOCK_N: gate columns with swiglu)
    warps: int = 8
    stages: int = 4
    half_tail: bool = True

    def label(self) -> str:
        m, n, k = self.blocks
        return f"{m}x{n}x{k} w{self.warps} s{self.stages}{' half' if self.half_tail else ''}"


def _blocks(swiglu: bool) -> tuple[int, int, int]:
    if _interpreted():
        return INTERPRETED_SWIGLU_BLOCKS if swiglu else INTERPRETED_BLOCKS
    return SWIGLU_BLOCKS if swiglu else BLOCKS


def launch(
    a: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    max_group: int,
    swiglu: bool = False,
    keep_h: bool = False,
    config: TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """a [P, K] rows sorted by group, w [E, K, N] (any layout with one unit stride in its last two dims),
    offsets [E] int32 cumulative row ends, max_group the largest group's rows -> ([P, N] in a's dtype,
    None). `swiglu`: w is W13 [E, K, 2I] and the first output the activation [P, I]; the second, with
    `keep_h`, the GEMM's own output h [P, 2I] (what the activation's backward reads). `config`: these
    blocks, warps and stages instead of the autotuned ones (the layer never passes one)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    k = _jit()
    trans = w.stride(2) != 1  # a transposed view of [E, N, K]: read in place, used transposed
    base = w.transpose(1, 2) if trans else w
    if base.stride(2) != 1:
        base = base.contiguous()
    rows, kr = a.shape
    experts, n = int(w.shape[0]), int(w.shape[2]) // (2 if swiglu else 1)
    out = a.new_empty(rows, n)
    h = a.new_empty(rows, 2 * n) if swiglu and keep_h else None
    if rows == 0 or n == 0 or experts == 0 or max_group == 0:
        return out, h
    if kr == 0:
        return out.zero_(), (h.zero_() if h is not None else None)
    a = a.contiguous()
    # the boxes of the TMA descriptors: the given or interpreted blocks, else set by the tuned config's
    # pre_hook (grouped_gemm_jit.set_blocks)
    bm, bn, bk = config.blocks if config is not None else _blocks(swiglu)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    a_half = TensorDescriptor.from_tensor(a, [bm // 2, bk])
    w_desc = TensorDescriptor.from_tensor(base, [1, bn, bk] if trans else [1, bk, bn])
    sms, held = _sm_count(a.device), held_sms()

    def grid(meta: dict[str, Any]) -> tuple[int]:
        tiles = experts * k.cdiv(n, meta["BLOCK_N"]) * k.cdiv(max_group, meta["BLOCK_M"])
        return (programs(tiles, sms, held),)

    persistent = held > 0
    # the persistent grid's tile counter, zeroed on the stream; the one-program-per-tile launch reads none
    next_tile = torch.zeros(1, dtype=torch.int32, device=a.device) if persistent else _idle_counter(a.device)
    options: dict[str, Any] = {}
    kernel = k.triton_grouped_gemm_tuned
    if config is not None or _interpreted():
        kernel = k.triton_grouped_gemm
        options = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, **INTERPRETED_OPTIONS}
        if config is not None:
            options["HALF_TAIL"] = config.half_tail
            if not _interpreted():
                options |= {"num_warps": config.warps, "num_stages": config.stages}
    kernel[grid](
        a_desc,
        a_half,
        w_desc,
        out,
        h if h is not None else out,
        offsets,
        experts,
        max_group,
        1 << max(0, max_group - 1).bit_length(),  # rows_key: the autotuner's size class
        next_tile,
        N=n,
        KR=int(kr),
        TRANS_W=trans,
        SWIGLU=swiglu,
        KEEP_H=h is not None,
        PERSISTENT=persistent,
        **options,
    )
    return out, h


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, max_group: int
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, w, offsets)
        ctx.max_group = max_group
        return launch(a, w, offsets, max_group)[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, w, offsets = ctx.saved_tensors
        return (*_input_and_weight_grads(ctx, a, w, offsets, grad.contiguous()), None, None)


def _input_and_weight_grads(
    ctx: Any, a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The GEMM's input gradient (the kernel on the weights transposed) and weight gradient (torch's
    reduction over each group's rows), each where autograd asks for it."""
    da = launch(grad, w.transpose(1, 2), offsets, ctx.max_group)[0] if ctx.needs_input_grad[0] else None
    dw = grouped_wgrad(a, grad, offsets).to(w.dtype) if ctx.needs_input_grad[1] else None
    return da, dw


class _GroupedSwiGLU(torch.autograd.Function):
    """a = swiglu(x @ W13) per group in one kernel; backward: the activation's gradient (moelab's Triton
    kernel, or torch's ops), then the GEMM's."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w13: torch.Tensor, offsets: torch.Tensor, max_group: int
    ) -> torch.Tensor:  # type: ignore[override]
        a, h = launch(x, w13, offsets, max_group, swiglu=True, keep_h=True)
        ctx.save_for_backward(x, w13, offsets, h)
        ctx.max_group = max_group
        return a

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, w13, offsets, h = ctx.saved_tensors
        grad_h = _swiglu_backward(h, grad_a.contiguous())
        return (*_input_and_weight_grads(ctx, x, w13, offsets, grad_h), None, None)


def _swiglu_backward(h: torch.Tensor, grad_a: torch.Tensor) -> torch.Tensor:
    """The activation's gradient w.r.t. h: moelab's Triton kernel on CUDA; the interpreter's tests take
    autograd's through the activation's torch path (in float32, as the kernel computes)."""
    if h.is_cuda:
        return triton_kernels.swiglu_backward(h, grad_a)
    hg = h.detach().float().requires_grad_(True)
    with torch.enable_grad():  # backward runs with grad mode off
        (grad_h,) = torch.autograd.grad(swiglu(hg, "torch"), hg, grad_a.float())
    return grad_h.to(h.dtype)


def tuned_tiles(hidden: int | None = None, intermediate: int | None = None) -> list[str]:
    """The tile, pipeline depth and tail the autotuner chose for each GEMM shape this process has launched
    ("gemm N=7168 K=2048 rows<=512: 128x256x32 w8 s6 half"), those of a layer of `hidden` and
    `intermediate` where given (its GEMMs' N and K are among H, I and 2I; the autotuner's choices outlive
    the case that made them); [] where the kernel never ran tuned."""
    jit = sys.modules.get(f"{__package__}.grouped_gemm_jit")  # never imports triton itself
    if jit is None:
        return []
    dims = None if hidden is None or intermediate is None else {hidden, intermediate, 2 * intermediate}
    out = []
    for key, config in jit.triton_grouped_gemm_tuned.cache.items():
        n, kr, trans, swiglu, _keep_h, persistent, rows_key = key[:7]
        if dims is not None and not {n, kr} <= dims:
            continue
        what = "fc1+swiglu" if swiglu else ("input grad" if trans else "gemm")
        tile = TileConfig(
            (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.kwargs["BLOCK_K"]),
            config.num_warps,
            config.num_stages,
            config.kwargs["HALF_TAIL"],
        )
        carved = ", carved out" if persistent else ""
        out.append(f"{what} N={n} K={kr} rows<={rows_key}{carved}: {tile.label()}")
    return sorted(out)


def triton_grouped_mm(
    a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, max_group: int
) -> torch.Tensor:
    """torch._grouped_mm(a, w, offs=offsets) through the Triton kernel, with autograd."""
    if torch.is_grad_enabled() and (a.requires_grad or w.requires_grad):
        return _GroupedMM.apply(a, w, offsets, max_group)  # type: ignore[no-any-return]
    return launch(a, w, offsets, max_group)[0]


def triton_grouped_swiglu(
    x: torch.Tensor, w13: torch.Tensor, offsets: torch.Tensor, max_group: int
) -> torch.Tensor:
    """silu(h[:, :I]) * h[:, I:] of h = x @ W13 per group, in one kernel (h is never written unless
    backward needs it), with autograd."""
    if torch.is_grad_enabled() and (x.requires_grad or w13.requires_grad):
        return _GroupedSwiGLU.apply(x, w13, offsets, max_group)  # type: ignore[no-any-return]
    return launch(x, w13, offsets, max_group, swiglu=True)[0]
