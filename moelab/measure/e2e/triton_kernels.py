"""Triton kernels for the e2e layer's memory-bound steps: the permute's row gather, the un-permute's
weighted sum over each row's slots, and the fused SwiGLU (forward and backward).

Each program owns one output row and one block of its columns, reads what that row needs and writes it
once: no atomics, so every result is bitwise the same run to run, and each step moves the bytes it must
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
from types import ModuleType
from typing import Any

import torch

MAX_BLOCK = 4096  # columns per program: one row of 8192 bf16 in two programs, 16-byte vectors per thread


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


def _launch(width: int) -> tuple[ModuleType, int, dict[str, Any]]:
    """The kernels, the column block for rows `width` wide, and the launch options for that block."""
    k = kernels()
    block = min(k.next_power_of_2(max(width, 1)), MAX_BLOCK)
    return k, block, {"BLOCK": block, "num_warps": 8 if block >= 4096 else 4}


def gather_rows(src: torch.Tensor, index: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """src[index] as a new [N, H] tensor of src's dtype, each row times scale[i] (float32) where given."""
    n, hidden = int(index.numel()), int(src.shape[1])
    dst = src.new_empty(n, hidden)
    if n == 0 or hidden == 0:
        return dst
    k, block, opts = _launch(hidden)
    src_c = src.contiguous()
    k.gather_rows[(n, k.cdiv(hidden, block))](
        src_c, index, scale if scale is not None else index, dst, hidden, HAS_SCALE=scale is not None, **opts
    )
    return dst


def slot_sum(y: torch.Tensor, slot_pair: torch.Tensor, slot_weight: torch.Tensor | None) -> torch.Tensor:
    """[R, H]: each row's slots' pairs of y summed (weighted by slot_weight where given) in float32."""
    rows, topk = slot_pair.shape
    hidden = int(y.shape[1])
    out = y.new_empty(rows, hidden)
    if rows == 0 or hidden == 0:
        return out
    k, block, opts = _launch(hidden)
    k.slot_sum[(rows, k.cdiv(hidden, block))](
        y.contiguous(), slot_pair, slot_weight if slot_weight is not None else slot_pair, out, hidden,
        K=topk, WEIGHTED=slot_weight is not None, **opts,
    )  # fmt: skip
    return out


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :I]) * h[:, I:] for h [P, 2I], one pass."""
    pairs, inter = int(h.shape[0]), int(h.shape[1]) // 2
    a = h.new_empty(pairs, inter)
    if pairs and inter:
        k, block, opts = _launch(inter)
        k.swiglu_fwd[(pairs, k.cdiv(inter, block))](h.contiguous(), a, inter, **opts)
    return a


def swiglu_backward(h: torch.Tensor, grad_a: torch.Tensor) -> torch.Tensor:
    """The gradient of `swiglu` w.r.t. h [P, 2I], one pass."""
    pairs, inter = int(h.shape[0]), int(h.shape[1]) // 2
    grad_h = h.new_empty(pairs, 2 * inter)
    if pairs and inter:
        k, block, opts = _launch(inter)
        k.swiglu_bwd[(pairs, k.cdiv(inter, block))](
            h.contiguous(), grad_a.contiguous(), grad_h, inter, **opts
        )
    return grad_h
