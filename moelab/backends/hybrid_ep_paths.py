"""Hybrid-EP's two APIs, one class each: the plain path (`dispatch` / `combine`, layout split from the
payload) and the permute paths (`dispatch_with_permute` / `combine_with_unpermute`, fused or not, timed
whole). The backend (moelab.backends.hybrid_ep) makes the one its prepared case's knobs name; what differs
between them is here rather than behind run-time branches.

Both read the library's handle by name (moelab.backends.hybrid_ep_handle).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from moelab.backends.base import Dispatched
from moelab.backends.hybrid_ep_handle import PermuteHandle, PlainHandle
from moelab.backends.input_cache import InputCache
from moelab.backends.knobs import Knobs, knob
from moelab.core.workload import Workload

HOST_SYNC = (
    "HybridEPBuffer synchronizes the stream on the host (num_dispatched_tokens read from pinned memory)"
)


@dataclass(frozen=True, kw_only=True)
class HybridKnobs(Knobs):
    owner = "hybrid-ep"
    unknown_message = "{owner}: unknown knob(s) {unknown} (knobs: {declared})"
    fused: bool = knob(
        False, "true: fuse_permute_dispatch / fuse_unpermute_combine (expert-major rows, one kernel each way)"
    )
    permute: bool = knob(False, "true: dispatch_with_permute / combine_with_unpermute")
    pad_multiple: int | None = knob(None, "permute paths: rows per expert padded to this multiple")
    combine_sms: int | None = knob(None, "SMs of combine when they differ from --sms")


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridSettings:
    fused: bool
    permute: bool  # True for both permute paths (fused or not)
    pad_multiple: int | None
    combine_sms: int | None

    @property
    def path(self) -> str:
        return "fused" if self.fused else ("permute" if self.permute else "plain")

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any]) -> HybridSettings:
        k = HybridKnobs.parse(knobs)
        return cls(
            fused=k.fused,
            permute=k.fused or k.permute,
            pad_multiple=k.pad_multiple,
            combine_sms=k.combine_sms,
        )


@dataclass(slots=True)
class HybridHandle:
    lib: PlainHandle | PermuteHandle  # the library's handle, read by name
    rows_pos: torch.Tensor | None  # permute paths: the permuted row that carries each exposed row
    num_permuted: int | None
    # the contract's local ids and weights, derived once per handle (not inside later timed dispatches)
    recv_topk_idx: torch.Tensor | None = None
    recv_topk_weights: torch.Tensor | None = None


def local_topk(
    local_map: torch.Tensor, local_weights: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, E_local] bool map and weights → [R, topk] local ids (-1 where none) and weights (0 there).

    A token has at most min(topk, E_local) experts on one rank, so the ids fit `topk` columns."""
    rows, epr = local_map.shape
    ar = torch.arange(epr, device=local_map.device).expand(rows, epr)
    if epr > topk:  # compact: routed experts first, in id order
        order = torch.sort(torch.where(local_map, ar, ar + epr), dim=1).indices[:, :topk]
        local_map, local_weights, ar = local_map.gather(1, order), local_weights.gather(1, order), order
    ids = torch.where(local_map, ar, -1)
    weights = torch.where(local_map, local_weights.float(), 0.0)
    if ids.shape[1] < topk:
        pad = topk - ids.shape[1]
        ids = torch.cat([ids, ids.new_full((rows, pad), -1)], dim=1)
        weights = torch.cat([weights, weights.new_zeros((rows, pad))], dim=1)
    return ids, weights


class HybridPath(abc.ABC):
    """One API of HybridEPBuffer for one prepared case: `buf` its buffer, `world` the ranks."""

    phases: ClassVar[bool]  # layout timed apart from the payload

    def __init__(self, buf: Any, settings: HybridSettings, workload: Workload, world: int) -> None:
        self.buf, self.settings, self.workload = buf, settings, workload
        self.num_experts = workload.num_experts(world)

    def received(self, token: torch.Tensor) -> torch.Tensor:
        return token.view(torch.float8_e4m3fn) if self.workload.dtype == "fp8" else token

    def local_weights(self, probs: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        epr, lr = self.workload.experts_per_rank, self.buf.local_rank
        if rows is None:
            return probs[:, lr * epr : (lr + 1) * epr]
        if probs.dim() == 1:
            return probs[rows]
        return probs[rows, lr * epr + torch.arange(epr, device=probs.device)]

    @abc.abstractmethod
    def dispatch(
        self,
        hidden: torch.Tensor,
        scales: torch.Tensor | None,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: HybridHandle | None,
    ) -> Dispatched:
        """The library's dispatch, fresh (no handle) or along `handle`, as the contract's Dispatched."""

    @abc.abstractmethod
    def combine(self, expert_out: torch.Tensor, handle: HybridHandle) -> torch.Tensor: ...

    @abc.abstractmethod
    def host_sync_ops(self) -> dict[str, str]: ...

    def handle_dispatch_reason(self) -> str | None:
        """Why rows cannot be sent along a handle on this path (the e2e layer's backward), or None."""
        return None


class PlainPath(HybridPath):
    """`dispatch` / `combine`: one row per (token, this rank); layout is the metadata preprocessing."""

    phases = True

    def dispatch(
        self,
        hidden: torch.Tensor,
        scales: torch.Tensor | None,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: HybridHandle | None,
    ) -> Dispatched:
        # along a handle as Hybrid-EP's benchmark calls it: routing and the cached handle both passed
        along = {} if handle is None else {"handle": handle.lib}
        token, probs, got_scales, lib = self.buf.dispatch(
            hidden=hidden,
            scaling_factor=scales,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            num_of_experts=self.num_experts,
            **along,
        )
        if handle is not None and handle.recv_topk_idx is not None:
            # same routing along a known handle: rows land where they did, ids and weights are the handle's
            assert handle.recv_topk_weights is not None
            return Dispatched(
                self.received(token), handle.recv_topk_idx, handle.recv_topk_weights, handle, got_scales
            )
        view = PlainHandle.of(lib)
        rows = int(token.shape[0])
        local_map = view.local_expert_routing_map[:rows]
        ids, weights = local_topk(local_map, self.local_weights(probs), self.workload.topk)
        made = HybridHandle(
            lib=view, rows_pos=None, num_permuted=rows, recv_topk_idx=ids, recv_topk_weights=weights
        )
        if handle is not None:  # keep the layout()'s handle, now with ids, weights and the received rows
            handle.recv_topk_idx, handle.recv_topk_weights, handle.num_permuted = ids, weights, rows
        return Dispatched(
            recv_x=self.received(token),
            recv_topk_idx=ids,
            recv_topk_weights=weights,
            handle=made,
            recv_scales=got_scales,
        )

    def combine(self, expert_out: torch.Tensor, handle: HybridHandle) -> torch.Tensor:
        combined: torch.Tensor = self.buf.combine(hidden=expert_out, probs=None, handle=handle.lib)[0]
        return combined

    def host_sync_ops(self) -> dict[str, str]:
        return {
            "dispatch_fresh": HOST_SYNC,
            "roundtrip": HOST_SYNC,
            "layout": "metadata preprocessing (non_blocking=False)",
            "dispatch": HOST_SYNC,
        }

    def dispatch_along(self, rows: torch.Tensor, scales: torch.Tensor | None, handle: HybridHandle) -> Any:
        """`dispatch(hidden, handle=...)` with no routing (the backward of combine): the library still
        asks the number of experts on index-based routing (its assertion), and the received row count is
        passed, so there is no host sync."""
        return self.buf.dispatch(
            hidden=rows,
            scaling_factor=scales,
            num_of_experts=self.num_experts,
            handle=handle.lib,
            num_dispatched_tokens=handle.num_permuted,
        )


class PermutePath(HybridPath):
    """`dispatch_with_permute` / `combine_with_unpermute` (fused or not): one row per (token, local
    expert), expert-major and padded; one copy per token is exposed, and combine puts each row in that copy
    with zeros in the others (an adapter, made once per (expert_out, handle))."""

    phases = False

    def __init__(self, buf: Any, settings: HybridSettings, workload: Workload, world: int) -> None:
        super().__init__(buf, settings, workload, world)
        self.combine_cache = InputCache()

    def dispatch(
        self,
        hidden: torch.Tensor,
        scales: torch.Tensor | None,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: HybridHandle | None,
    ) -> Dispatched:
        wl, s = self.workload, self.settings
        kwargs: dict[str, Any] = {
            "hidden": hidden,
            "scaling_factor": scales,
            "topk_idx": topk_idx,
            "topk_weights": topk_weights,
            "num_of_experts_per_rank": wl.experts_per_rank,
            "num_of_experts": self.num_experts,
            "use_fp8": wl.dtype == "fp8",
            "pad_multiple": s.pad_multiple,
            "fuse_permute_dispatch": s.fused,
        }
        if handle is not None:
            # a cached handle needs its permuted row count back (HandleImpl.num_permuted_tokens takes no None)
            kwargs["handle"] = handle.lib
            kwargs["num_permuted_tokens"] = handle.num_permuted
        token, probs, scales_out, _, lib = self.buf.dispatch_with_permute(**kwargs)
        view = PermuteHandle.of(lib)
        rows = view.num_dispatched()  # pinned host memory after dispatch's sync
        dense_to_expert = view.dense_to_expert_map[:rows].long()  # permuted row per (token, local expert)
        pos = dense_to_expert.max(dim=1).values
        local_map = dense_to_expert >= 0
        ids, weights = local_topk(local_map, self.local_weights(probs, dense_to_expert.clamp(min=0)), wl.topk)
        made = HybridHandle(lib=view, rows_pos=pos, num_permuted=int(token.shape[0]))
        made.recv_topk_idx, made.recv_topk_weights = ids, weights
        return Dispatched(
            recv_x=self.received(token[pos]),
            recv_topk_idx=ids,
            recv_topk_weights=weights,
            handle=made,
            recv_scales=None if scales_out is None else scales_out[pos],
        )

    def combine(self, expert_out: torch.Tensor, handle: HybridHandle) -> torch.Tensor:
        assert handle.rows_pos is not None and handle.num_permuted is not None
        rows_pos, num_permuted = handle.rows_pos, handle.num_permuted

        def permuted() -> torch.Tensor:
            buf = torch.zeros(
                num_permuted, expert_out.shape[1], dtype=expert_out.dtype, device=expert_out.device
            )
            buf[rows_pos] = expert_out
            return buf

        x = self.combine_cache.get([expert_out, rows_pos], permuted)
        combined: torch.Tensor = self.buf.combine_with_unpermute(
            hidden=x,
            probs=None,
            handle=handle.lib,
            pad_multiple=self.settings.pad_multiple,
            fuse_unpermute_combine=self.settings.fused,
        )[0]
        return combined

    def host_sync_ops(self) -> dict[str, str]:
        return {"dispatch_fresh": HOST_SYNC, "roundtrip": HOST_SYNC}

    def handle_dispatch_reason(self) -> str | None:
        return (
            "hybrid-ep backward: the plain path only (the permute paths' dispatch with a cached handle "
            "returns expert-major padded rows; run backward with permute = false)"
        )


def path_for(buf: Any, settings: HybridSettings, workload: Workload, world: int) -> HybridPath:
    kind = PermutePath if settings.permute else PlainPath
    return kind(buf, settings, workload, world)
