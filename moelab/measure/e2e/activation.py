"""The expert FFN's SwiGLU activation, a = silu(h[:, :I]) * h[:, I:], fused where the kernels allow.

torch's own path reads h twice and writes a temporary (silu, then the product), and its backward adds
a zero-filled gradient per half of h; the triton path (moelab.measure.e2e.triton_kernels) reads h once
and writes a once, and its backward reads (h, grad a) once and writes grad h once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from moelab.measure.e2e import triton_kernels


class _SwigluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(h)
        return triton_kernels.swiglu(h)

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (h,) = ctx.saved_tensors
        return triton_kernels.swiglu_backward(h, grad_a)


def swiglu(h: torch.Tensor, impl: str) -> torch.Tensor:
    """[P, 2I] -> [P, I]; `impl` "triton" runs the fused kernels, anything else torch's ops."""
    if impl != "triton":
        inter = h.shape[1] // 2
        return F.silu(h[:, :inter]) * h[:, inter:]
    if torch.is_grad_enabled() and h.requires_grad:
        return _SwigluFn.apply(h)  # type: ignore[no-any-return]
    return triton_kernels.swiglu(h)
