"""Single-process reference MoE layer in float32, on the gathered tokens and the same bf16 weights.

out[t] = Σ_k w[t,k] · FFN_{e[t,k]}(x[t]), with FFN the SwiGLU of moelab.measure.e2e.layer. The weights and
tokens are the layer's own bf16 values (upcast), so the difference from the distributed layer is the
layer's bf16 arithmetic (GEMM outputs, activation, weighting and sums rounded to bf16) and the payload
quantization of the backend, nothing else.

Tolerance, as ‖out − ref‖ / ‖ref‖ over a rank's tokens: 2e-2 for a bf16 layer. Each bf16 rounding has
a relative error up to 2^-9 ≈ 2e-3; a forward pass rounds h, the activation, y, the weighted y, the
per-row sum and combine's sum. Measured on CPU (2 gloo ranks, hidden 1024, intermediate 256, topk 8,
8 experts/rank): 5.2e-3 for the output, 5.1e-3 for the input gradient, 4.9e-3 for the weight
gradients; 2e-2 is four times that, and still far below what a wrong row costs (dropping or doubling
one of topk contributions is an error of about 1/√topk, 0.35 at topk 8). Quantized payloads add their
own budget from moelab.measure.reference: dispatch fp8/mxfp8 0.07, combine mxfp8 0.08 (MXFP8 both ways
measured 4.6e-2 against 0.17). Gradients get twice the forward budget (they pass the chain twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from moelab.measure.e2e.layer import expert_weight
from moelab.measure.reference import COMBINE_TOL, DISPATCH_TOL

BF16_LAYER_TOL = 2e-2


def layer_tolerance(dispatch_dtype: str, combine_dtype: str) -> float:
    """Relative-error bound of the layer output for the payload types of dispatch and combine."""
    return (
        BF16_LAYER_TOL
        + DISPATCH_TOL.get(dispatch_dtype, 0.0)
        + (COMBINE_TOL[combine_dtype] if combine_dtype != "bf16" else 0.0)
    )


def grad_tolerance(dispatch_dtype: str, combine_dtype: str) -> float:
    return 2 * layer_tolerance(dispatch_dtype, combine_dtype)


@dataclass(slots=True)
class ReferenceResult:
    out: torch.Tensor  # [N, H] float32
    grad_x: torch.Tensor | None = None  # [N, H] float32
    grad_w13: dict[int, torch.Tensor] = field(default_factory=dict)  # global expert -> [H, 2I] float32
    grad_w2: dict[int, torch.Tensor] = field(default_factory=dict)  # global expert -> [I, H] float32


def reference_layer(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    seed: int,
    intermediate: int,
    experts: Iterable[int] | None = None,
    grad_out: torch.Tensor | None = None,
    on_weight_grads: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> ReferenceResult:
    """The layer on tokens x [N, H] with global routing [N, K], in float32 on x's device.

    `experts`: only these experts contribute (default: every expert the routing names); with
    `grad_out`, the gradients of Σ out·grad_out for x and each included expert's weights. One expert
    at a time, so memory stays at one expert's weights however many there are: with `on_weight_grads`
    each expert's weight gradients go to it and are not kept (256 experts' float32 gradients at hidden
    7168 would be 45 GB).
    """
    hidden = x.shape[1]
    device = x.device
    x32 = x.detach().float().requires_grad_(grad_out is not None)
    out = torch.zeros(x.shape[0], hidden, dtype=torch.float32, device=device)
    idx = topk_idx.to(device)
    weights = topk_weights.to(device).float()
    ids = sorted(set(idx.unique().tolist()) if experts is None else set(experts))
    result = ReferenceResult(out=out)
    with torch.enable_grad():
        for e in ids:
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            w13b, w2b = expert_weight(seed, e, hidden, intermediate, device)
            w13 = w13b.float().requires_grad_(grad_out is not None)
            w2 = w2b.float().requires_grad_(grad_out is not None)
            h = x32[rows] @ w13
            y = (F.silu(h[:, :intermediate]) * h[:, intermediate:]) @ w2
            contrib = torch.zeros_like(out).index_add(0, rows, y * weights[rows, slot].unsqueeze(1))
            if grad_out is not None:
                grad_x_e, g13, g2 = torch.autograd.grad(
                    contrib, (x32, w13, w2), grad_out.float(), allow_unused=True
                )
                g13 = g13 if g13 is not None else torch.zeros_like(w13)
                g2 = g2 if g2 is not None else torch.zeros_like(w2)
                if on_weight_grads is not None:
                    on_weight_grads(e, g13, g2)
                else:
                    result.grad_w13[e], result.grad_w2[e] = g13, g2
                if grad_x_e is not None:
                    result.grad_x = grad_x_e if result.grad_x is None else result.grad_x + grad_x_e
            out += contrib.detach()
    if grad_out is not None and result.grad_x is None:
        result.grad_x = torch.zeros_like(out)
    return result
