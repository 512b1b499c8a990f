"""Triton kernels for the e2e layer's memory-bound steps: the permute's row gather, the un-permute's
weighted sum over each row's slots, and the fused SwiGLU (forward and backward).

Each program owns a tile of output rows and columns (autotuned on CUDA per row width), reads what those
rows need and writes them once: no atomics, so every result is bitwise the same run to run, and each step moves the bytes it must
(moelab.measure.e2e.roofline counts them) and no more. Arithmetic is float32, rounded to the output's
dtype once.

triton is imported on first use (`kernels()`), never at import: moelab runs without it, on CPU and where
it is not installed; `unavailable_reason` says why a tensor cannot take this path. Setting triton's
interpreter (TRITON_INTERPRET=1) before the first use runs these kernels on the CPU, which is how the
tests check them without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType
from typing import Any

import torch


def unavailable_reason(t: torch.Tensor) -> str | None:
    """None when `t` can go through these kernels (a CUDA tensor and triton installed), else why not."""
    if not t.is_cuda:
        return "triton kernels run on CUDA tensors only"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


@functools.cache
def kernels() -> ModuleType:
    """The module of @triton.jit kernels, imported (and so triton) on first use."""
    return importlib.import_module("moelab.measure.e2e.triton_jit")


INTERPRETED_TILE = {"BLOCK_R": 2, "BLOCK_C": 64}  # under triton's interpreter (CPU tests): one small tile


def _launch(name: str, rows: int, width: int) -> tuple[Any, Any, dict[str, Any]]:
    """The kernel to launch for `rows` x `width` outputs (autotuned on CUDA), its grid, and its options."""
    k = kernels()

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (k.cdiv(rows, meta["BLOCK_R"]), k.cdiv(width, meta["BLOCK_C"]))

    if os.environ.get("TRITON_INTERPRET") == "1":
        return getattr(k, name), grid, dict(INTERPRETED_TILE)
    return getattr(k, f"{name}_tuned"), grid, {}


def gather_rows(src: torch.Tensor, index: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """src[index] as a new [N, H] tensor of src's dtype, each row times scale[i] (float32) where given."""
    n, hidden = int(index.numel()), int(src.shape[1])
    dst = src.new_empty(n, hidden)
    if n == 0 or hidden == 0:
        return dst
    kernel, grid, opts = _launch("gather_rows", n, hidden)
    kernel[grid](
        src.contiguous(),
        index,
        scale if scale is not None else index,
        dst,
        n,
        hidden,
        HAS_SCALE=scale is not None,
        **opts,
    )
    return dst


def slot_sum(y: torch.Tensor, slot_pair: torch.Tensor, slot_weight: torch.Tensor | None) -> torch.Tensor:
    """[R, H]: each row's slots' pairs of y summed (weighted by slot_weight where given) in float32."""
    rows, topk = slot_pair.shape
    hidden = int(y.shape[1])
    out = y.new_empty(rows, hidden)
    if rows == 0 or hidden == 0:
        return out
    kernel, grid, opts = _launch("slot_sum", rows, hidden)
    kernel[grid](
        y.contiguous(),
        slot_pair,
        slot_weight if slot_weight is not None else slot_pair,
        out,
        rows,
        hidden,
        K=topk,
        WEIGHTED=slot_weight is not None,
        **opts,
    )
    return out


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :I]) * h[:, I:] for h [P, 2I], one pass."""
    pairs, inter = int(h.shape[0]), int(h.shape[1]) // 2
    a = h.new_empty(pairs, inter)
    if pairs and inter:
        kernel, grid, opts = _launch("swiglu_fwd", pairs, inter)
        kernel[grid](h.contiguous(), a, pairs, inter, **opts)
    return a


def swiglu_backward(h: torch.Tensor, grad_a: torch.Tensor) -> torch.Tensor:
    """The gradient of `swiglu` w.r.t. h [P, 2I], one pass."""
    pairs, inter = int(h.shape[0]), int(h.shape[1]) // 2
    grad_h = h.new_empty(pairs, 2 * inter)
    if pairs and inter:
        kernel, grid, opts = _launch("swiglu_bwd", pairs, inter)
        kernel[grid](h.contiguous(), grad_a.contiguous(), grad_h, pairs, inter, **opts)
    return grad_h
