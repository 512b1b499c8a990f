"""`nccl-a2a`: dispatch/combine through torch.distributed.all_to_all_single (NCCL on GPU, gloo on CPU).

Dispatch: (1) from topk_idx, which ranks each token goes to (once per rank, however many of its experts
live there); (2) exchange per-rank counts with one all_to_all_single; (3) one device→host copy of the
send/receive counts, the only host synchronisation, needed because all_to_all_single takes split sizes
on the host; (4) gather the rows into rank order (index_select into a reused buffer); (5) one
all_to_all_single for the routing metadata (local expert ids, and weights widened to 64 bits) and one
for the payload; the metadata and gather order are enqueued before the host sync so that only three
launches follow it.
Combine: one all_to_all_single back with the splits reversed, then index_add at the source.
Knob `layout = "cached"` reuses the layout (steps 1-3 and the metadata exchange) of the first dispatch of
the same routing tensor, as DeepEP's cached-handle mode and a backward pass do: dispatch is then the gather
and one payload all_to_all_single, with no host sync. The default, "fresh", computes it every call.
--sms maps to NCCL's CTA limits (ncclConfig_t min/max CTAs) of a communicator made per SM count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig, Dispatched
from moelab.backends.input_cache import InputCache

LAYOUTS = ("fresh", "cached")


@dataclass(slots=True)
class A2AHandle:
    send_tok: torch.Tensor  # [S] source token of each sent row, rank-major
    send_splits: list[int]
    recv_splits: list[int]
    num_tokens: int


class NcclA2ABackend(Backend):
    name = "nccl-a2a"
    description = "torch.distributed all_to_all_single (NCCL on GPU, gloo on CPU)"
    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control = "NCCL communicator per SM count with ncclConfig min_ctas = max_ctas = sms"

    @classmethod
    def availability(cls) -> str | None:
        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        return None

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        world = ctx.world
        max_rows = max((c.workload.tokens_per_rank * world for c in cases), default=1)
        max_hidden = max((c.workload.hidden for c in cases), default=1)
        max_topk = max((c.workload.topk for c in cases), default=1)
        dev = ctx.device
        self._send = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._recv = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._back = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._send_meta = torch.empty(max_rows * 2 * max_topk, dtype=torch.int64, device=dev)
        self._recv_meta = torch.empty(max_rows * 2 * max_topk, dtype=torch.int64, device=dev)
        self._counts = torch.empty(2 * world, dtype=torch.int64, device=dev)
        self._groups: dict[int | None, Any] = {None: ctx.group}
        self._group = ctx.group
        self._experts_per_rank = 1
        self._cached_layout = False
        self._layout_cache = InputCache()

    def unsupported_reason(self, case: CaseConfig) -> str | None:
        layout = case.knobs.get("layout", "fresh")
        if layout not in LAYOUTS:
            return f"{self.name}: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"
        if self.name == "nccl-a2a" and set(case.knobs) - {"layout"}:
            return (
                f"nccl-a2a: unknown knob(s) {', '.join(sorted(set(case.knobs) - {'layout'}))} (knobs: layout)"
            )
        if case.sms is not None and self.ctx.comm_backend != "nccl":
            return f"SM control needs NCCL; {self.ctx.comm_backend} has none (run sms = default)"
        return super().unsupported_reason(case)

    def prepare(self, case: CaseConfig) -> None:
        self._experts_per_rank = case.workload.experts_per_rank
        self._cached_layout = case.knobs.get("layout", "fresh") == "cached"
        self._layout_cache.clear()
        if case.sms not in self._groups:
            assert case.sms is not None  # None is the default group, present from the start
            opts = dist.ProcessGroupNCCL.Options()
            opts.config.min_ctas = case.sms
            opts.config.max_ctas = case.sms
            self._groups[case.sms] = dist.new_group(
                ranks=list(range(self.ctx.world)), backend="nccl", pg_options=opts
            )
        self._group = self._groups[case.sms]

    def host_sync_note(self) -> str:
        if self._cached_layout:
            return "none (layout cached from the first dispatch of the routing)"
        return "dispatch: one device-to-host copy of the per-rank send/receive counts (split sizes for all_to_all_single)"

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        if self._cached_layout:
            return self._dispatch_cached(x, topk_idx, topk_weights)
        return self._dispatch_fresh(x, topk_idx, topk_weights)

    def _dispatch_cached(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Dispatched:
        def first() -> Dispatched:
            d = self._dispatch_fresh(x, topk_idx, topk_weights)
            # keep the layout and metadata out of the reused buffers
            return Dispatched(
                recv_x=d.recv_x,
                recv_topk_idx=d.recv_topk_idx.clone(),
                recv_topk_weights=d.recv_topk_weights.clone(),
                handle=d.handle,
            )

        cached: Dispatched = self._layout_cache.get([topk_idx, topk_weights], first)
        handle: A2AHandle = cached.handle
        hidden = x.shape[1]
        num_send, num_recv = sum(handle.send_splits), sum(handle.recv_splits)
        send_x = self._send[: num_send * hidden].view(num_send, hidden)
        torch.index_select(x, 0, handle.send_tok, out=send_x)
        recv_x = self._recv[: num_recv * hidden].view(num_recv, hidden)
        dist.all_to_all_single(recv_x, send_x, handle.recv_splits, handle.send_splits, group=self._group)
        return Dispatched(
            recv_x=recv_x,
            recv_topk_idx=cached.recv_topk_idx,
            recv_topk_weights=cached.recv_topk_weights,
            handle=handle,
        )

    def _dispatch_fresh(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Dispatched:
        world, group = self.ctx.world, self._group
        num_tokens, hidden = x.shape
        topk = topk_idx.shape[1]
        epr = self._experts_per_rank
        dest = topk_idx // epr  # [T, K]
        in_rank = torch.zeros(num_tokens, world, dtype=torch.bool, device=x.device)
        in_rank.scatter_(1, dest, True)
        counts = self._counts
        torch.sum(in_rank, dim=0, out=counts[:world])
        dist.all_to_all_single(counts[world:], counts[:world], group=group)

        # Everything that does not need the counts on the host is enqueued before the sync, so that after
        # it only the gather and the two collectives are launched (the GPU idles while the host launches).
        flat = in_rank.t().reshape(-1)  # (destination rank, token) order
        order = torch.sort(flat.logical_not().to(torch.uint8), stable=True).indices  # selected entries first
        send_tok_all = order % num_tokens
        send_rank_all = order // num_tokens
        local = topk_idx.index_select(0, send_tok_all) - (send_rank_all * epr).unsqueeze(1)
        on_dest = (local >= 0) & (local < epr)
        meta_all = self._send_meta[: order.numel() * 2 * topk].view(-1, 2 * topk)
        meta_all[:, :topk].copy_(torch.where(on_dest, local, -1))
        meta_all[:, topk:].view(torch.float64).copy_(
            torch.where(on_dest, topk_weights.index_select(0, send_tok_all), 0.0)
        )

        both = counts.tolist()  # the one host sync: all_to_all_single takes split sizes on the host
        send_splits, recv_splits = both[:world], both[world:]
        num_send, num_recv = sum(send_splits), sum(recv_splits)
        send_tok = send_tok_all[:num_send]
        send_x = self._send[: num_send * hidden].view(num_send, hidden)
        torch.index_select(x, 0, send_tok, out=send_x)
        recv_meta = self._recv_meta[: num_recv * 2 * topk].view(num_recv, 2 * topk)
        dist.all_to_all_single(recv_meta, meta_all[:num_send], recv_splits, send_splits, group=group)
        recv_x = self._recv[: num_recv * hidden].view(num_recv, hidden)
        dist.all_to_all_single(recv_x, send_x, recv_splits, send_splits, group=group)
        handle = A2AHandle(send_tok, send_splits, recv_splits, num_tokens)
        return Dispatched(
            recv_x=recv_x,
            recv_topk_idx=recv_meta[:, :topk],
            recv_topk_weights=recv_meta[:, topk:].view(torch.float64),
            handle=handle,
        )

    def combine(self, expert_out: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        return self._sum_at_source(self._exchange_back(expert_out, handle), handle)

    def _exchange_back(self, rows: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Send each received row back to its source rank (splits reversed); rows may be any 2-byte type."""
        num_send = sum(handle.send_splits)
        width = rows.shape[1]
        back = self._back[: num_send * width].view(num_send, width).view(rows.dtype)
        dist.all_to_all_single(back, rows, handle.send_splits, handle.recv_splits, group=self._group)
        return back

    def _sum_at_source(self, back: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Sum each token's rows. A segment that holds every token (rows are in token order within each
        destination) is added densely; a partial one goes through index_add_."""
        hidden = back.shape[1]
        out = torch.empty(handle.num_tokens, hidden, dtype=back.dtype, device=back.device)
        initialised = False
        start = 0
        for count in handle.send_splits:
            seg = back[start : start + count]
            if count == handle.num_tokens:
                if initialised:
                    out.add_(seg)
                else:
                    out.copy_(seg)
                    initialised = True
            elif count:
                if not initialised:
                    out.zero_()
                    initialised = True
                out.index_add_(0, handle.send_tok[start : start + count], seg)
            start += count
        if not initialised:
            out.zero_()
        return out

    def close(self) -> None:
        for sms, group in self._groups.items():
            if sms is not None:
                dist.destroy_process_group(group)
        self._groups = {None: self.ctx.group}

    def library_versions(self) -> dict[str, str]:
        versions = {"torch": str(torch.__version__)}
        if torch.cuda.is_available() and torch.cuda.nccl.is_available([]):  # type: ignore[no-untyped-call]
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        return versions

    def record(self, case: CaseConfig) -> dict[str, Any]:
        return {
            "comm_backend": self.ctx.comm_backend,
            "nccl_ctas": case.sms,
            "layout": case.knobs.get("layout", "fresh"),
        }

    def dispatch_with_handle(self, rows: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Send one row per source token (`rows` [T, H], e.g. the gradient of combine's output) to where an
        earlier dispatch sent that token, along its `handle`: [R, H] in that dispatch's received order.

        The backward of combine (moelab.e2e). The rows cross as they are (no quantization), into fresh
        tensors rather than the reused buffers, so the result outlives the next dispatch.
        """
        send = rows.index_select(0, handle.send_tok)
        recv = torch.empty(sum(handle.recv_splits), rows.shape[1], dtype=rows.dtype, device=rows.device)
        dist.all_to_all_single(recv, send, handle.recv_splits, handle.send_splits, group=self._group)
        return recv
