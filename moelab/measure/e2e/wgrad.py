"""The expert weights' gradient of an overlapped layer's parts, computed once after every part's backward
(Megatron-Core's `delay_wgrad_compute`, zero-bubble pipelining's split of backward into the input and the
weight gradient).

Left to autograd, each part's backward computes a whole weight gradient, [E, H, 2I] and [E, I, H] however
few rows the part had, and autograd sums them into `.grad`: with n parts, n gradient writes and n - 1
sums of the weights' size. At 128 experts per rank (the DeepSeek-V3 preset at EP = 2) the weights are
11 GB per rank, and that traffic alone made tbo's forward+backward about twice serial's (2 x H100,
results/h100x2-r9). Here a part's GEMMs see the weights detached, so its backward computes only the
input gradients; hooks keep each part's GEMM inputs and output gradients; and the last part's backward
hands autograd the weight gradient of all of them: one GEMM over every part's rows regrouped by expert
(grouped: the rows gathered in expert order; padded: the padded blocks side by side), or, where
regrouping would move more bytes than it saves (few experts, many rows), one GEMM per part, summed, as
autograd did. Either way the gradient is the same sum, in another order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

DEFERRED_IMPLS = (
    "grouped",
    "padded",
)  # the GEMMs whose weight gradient is computed here (grouped-wide: grouped)


@dataclass(slots=True)
class PartRows:
    """One part's GEMM inputs and, once its backward has run, their output gradients.
    grouped: rows [P, .] sorted by expert with `offsets`; padded: blocks [E, m, .]."""

    x: torch.Tensor  # the first GEMM's input
    a: torch.Tensor  # the second GEMM's input (the activation)
    offsets: torch.Tensor | None  # grouped: [E] int32 cumulative row ends; padded: None
    rows: int  # grouped: the rows in groups (grouped-wide's pad rows past the last group are left out)
    dh: torch.Tensor | None = None  # the first GEMM's output gradient
    dy: torch.Tensor | None = None  # the second's

    def keep_dh(self, grad: torch.Tensor) -> None:
        self.dh = grad

    def keep_dy(self, grad: torch.Tensor) -> None:
        self.dy = grad

    def nbytes(self) -> int:
        """The bytes a regrouping moves once: grouped, the rows in groups; padded, the whole blocks."""
        kept = [t for t in (self.x, self.a, self.dh, self.dy) if t is not None]
        if self.offsets is None:
            return sum(t.numel() * t.element_size() for t in kept)
        return sum(self.rows * t.shape[1] * t.element_size() for t in kept)


def grouped_wgrad(x: torch.Tensor, g: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[E, K, N]: per expert, its rows of x [P, K] transposed times its rows of g [P, N]."""
    return torch._grouped_mm(x.t(), g, offs=offsets)


@dataclass(slots=True)
class DeferredWgrad:
    """The weight gradient of one overlapped forward's parts (made per forward, read by its backward)."""

    w13: torch.Tensor
    w2: torch.Tensor
    impl: str  # "grouped" or "padded"
    parts: list[PartRows] = field(default_factory=list)
    expected: int = 0  # parts whose forward went through here
    done: int = 0  # parts whose backward has run
    on_done: Callable[[str], None] | None = None  # told how the gradient was computed ("merged", "per part")

    def weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The part's GEMM input tied to the weights (its backward hands them their gradient once every
        part's is known), and the weights detached for its GEMMs."""
        self.expected += 1
        tied = _TieWeights.apply(x, self.w13, self.w2, self)
        return tied, self.w13.detach(), self.w2.detach()

    def keep(
        self, x: torch.Tensor, h: torch.Tensor, a: torch.Tensor, y: torch.Tensor, offsets: Any, rows: int
    ) -> None:
        """Keep the part's GEMM inputs, and its output gradients when backward reaches them."""
        part = PartRows(x=x.detach(), a=a.detach(), offsets=offsets, rows=rows)
        h.register_hook(part.keep_dh)
        y.register_hook(part.keep_dy)
        self.parts.append(part)

    def merge_pays(self) -> bool:
        """Regrouping every part's rows moves fewer bytes than the per-part gradients and their sum."""
        weight_bytes = self.w13.numel() * self.w13.element_size() + self.w2.numel() * self.w2.element_size()
        saved = (len(self.parts) - 1) * 4 * weight_bytes  # a gradient written, then read twice and written
        passes = 4 if self.impl == "grouped" else 2  # concatenation (+ the gather in expert order)
        return len(self.parts) > 1 and passes * sum(p.nbytes() for p in self.parts) < saved

    def gradients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dW13, dW2) of every part, the weights' dtype."""
        parts = self.parts
        assert all(p.dh is not None and p.dy is not None for p in parts), "a part's backward did not run"
        how = "merged" if self.merge_pays() else "per part"
        if self.on_done is not None:
            self.on_done(how)
        if how == "merged":
            got = self._merged()
        else:
            got = self._one(parts[0])
            for p in parts[1:]:
                more = self._one(p)
                got = (got[0] + more[0], got[1] + more[1])
        return got[0].to(self.w13.dtype), got[1].to(self.w2.dtype)

    def _one(self, p: PartRows) -> tuple[torch.Tensor, torch.Tensor]:
        assert p.dh is not None and p.dy is not None
        if self.impl == "padded":
            return torch.bmm(p.x.transpose(1, 2), p.dh), torch.bmm(p.a.transpose(1, 2), p.dy)
        assert p.offsets is not None
        r = p.rows
        return grouped_wgrad(p.x[:r], p.dh[:r], p.offsets), grouped_wgrad(p.a[:r], p.dy[:r], p.offsets)

    def _merged(self) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self.parts
        if self.impl == "padded":  # each expert's block of every part side by side: one batched GEMM
            x, a = torch.cat([p.x for p in parts], 1), torch.cat([p.a for p in parts], 1)
            dh = torch.cat([p.dh for p in parts if p.dh is not None], 1)
            dy = torch.cat([p.dy for p in parts if p.dy is not None], 1)
            return torch.bmm(x.transpose(1, 2), dh), torch.bmm(a.transpose(1, 2), dy)
        keys, offsets = [], None
        for p in parts:
            assert p.offsets is not None
            counts = torch.diff(p.offsets.long(), prepend=p.offsets.new_zeros(1).long())
            experts = torch.arange(counts.numel(), device=counts.device)
            keys.append(torch.repeat_interleave(experts, counts, output_size=p.rows))  # no host sync
            offsets = p.offsets if offsets is None else offsets + p.offsets
        assert offsets is not None
        order = torch.sort(torch.cat(keys), stable=True).indices  # every part's rows of expert e together

        def gathered(ts: list[torch.Tensor | None]) -> torch.Tensor:
            return torch.cat(
                [t[: p.rows] for t, p in zip(ts, parts, strict=True) if t is not None]
            ).index_select(0, order)

        x, a = gathered([p.x for p in parts]), gathered([p.a for p in parts])
        dh, dy = gathered([p.dh for p in parts]), gathered([p.dy for p in parts])
        return grouped_wgrad(x, dh, offsets), grouped_wgrad(a, dy, offsets)


class _TieWeights(torch.autograd.Function):
    """x through unchanged; its backward (after its part's GEMMs' backward) counts the part done and, for
    the last, returns the weights' gradient of every part."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, owner: DeferredWgrad
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.owner = owner
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        owner: DeferredWgrad = ctx.owner
        owner.done += 1
        if owner.done < owner.expected:
            return grad, None, None, None
        g13, g2 = owner.gradients()
        owner.parts.clear()
        return grad, g13, g2, None
