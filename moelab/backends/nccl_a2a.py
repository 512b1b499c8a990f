"""`nccl-a2a`: dispatch/combine over torch.distributed point-to-point exchanges (NCCL on GPU, gloo on CPU).

The baseline every library is compared against, so it is written as a careful torch implementation would be:
- layout: which ranks each token goes to (once per rank, however many of its experts live there), the
  per-rank counts and their exchange, the rows' routing metadata (local expert ids, weights) in
  destination order, one device-to-host copy of the counts (the only host synchronisation: NCCL takes
  split sizes on the host), and the metadata exchange;
- dispatch with the layout known: one all_to_all of tensor lists (one NCCL group of sends and receives)
  of the payload. A destination that receives every token in token order (common when topk covers many
  experts per rank) is sent `x` itself, with no gather; only partial destinations gather their rows;
- a fresh dispatch does both, with the metadata and the payload in ONE grouped exchange after the host
  sync, and everything that does not need the counts on the host (sort, metadata) enqueued before it,
  while the host waits only on an event behind the count exchange;
- combine: the rows back along the reversed splits, then a dense sum where a segment holds every token.
--sms maps to NCCL's CTA limits (ncclConfig_t min/max CTAs) of a communicator made per SM count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig, Dispatched

HOST_SYNC = "one device-to-host copy of the per-rank counts (NCCL takes split sizes on the host)"


@dataclass(slots=True)
class A2AHandle:
    """The layout of one routing: what dispatch needs to move the payload, and combine to bring it back."""

    send_tok: torch.Tensor  # [S] source token of each sent row, destination-major
    send_splits: list[int]
    recv_splits: list[int]
    num_tokens: int
    recv_topk_idx: torch.Tensor  # [R, K] local expert ids, -1 elsewhere
    recv_topk_weights: torch.Tensor  # [R, K] float64

    @property
    def full(self) -> list[bool]:
        """Per destination: it receives every token in token order, so `x` itself can be sent."""
        return [c == self.num_tokens for c in self.send_splits]


@dataclass(slots=True)
class _Routed:
    """A routing's layout before the host knows the counts (everything enqueued ahead of the sync)."""

    counts_host: torch.Tensor  # pinned [2W]: send counts, then receive counts
    ready: Any  # a CUDA event behind the count exchange's copy (None on CPU)
    send_tok_all: torch.Tensor  # [T*W] candidate rows, selected ones first, destination-major
    meta_all: torch.Tensor  # [T, 2K] int64: each token's global expert ids, then its weights as float64 bits
    num_tokens: int
    topk: int


class NcclA2ABackend(Backend):
    name = "nccl-a2a"
    description = "torch.distributed grouped point-to-point exchanges (NCCL on GPU, gloo on CPU)"
    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control = "NCCL communicator per SM count with ncclConfig min_ctas = max_ctas = sms"
    phases = True

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
        dev = ctx.device
        self._send = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._recv = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._back = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._counts = torch.empty(2 * world, dtype=torch.int64, device=dev)
        self._counts_host = torch.empty(2 * world, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._groups: dict[int | None, Any] = {None: ctx.group}
        self._group = ctx.group
        self._experts_per_rank = 1
        self._lists = ctx.comm_backend == "nccl"  # all_to_all of tensor lists: uneven sizes need NCCL

    def unsupported_reason(self, case: CaseConfig) -> str | None:
        if case.sms is not None and self.ctx.comm_backend != "nccl":
            return f"SM control needs NCCL; {self.ctx.comm_backend} has none (run sms = default)"
        return super().unsupported_reason(case)

    def prepare(self, case: CaseConfig) -> None:
        self._experts_per_rank = case.workload.experts_per_rank
        if case.sms not in self._groups:
            assert case.sms is not None  # None is the default group, present from the start
            opts = dist.ProcessGroupNCCL.Options()
            opts.config.min_ctas = case.sms
            opts.config.max_ctas = case.sms
            self._groups[case.sms] = dist.new_group(
                ranks=list(range(self.ctx.world)), backend="nccl", pg_options=opts
            )
        self._group = self._groups[case.sms]

    def host_sync_ops(self) -> dict[str, str]:
        return {"layout": HOST_SYNC, "dispatch_fresh": HOST_SYNC, "roundtrip": HOST_SYNC}

    # -- layout ---------------------------------------------------------------------------------------

    def _route(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> _Routed:
        """Counts, their exchange, the send order and the routing rows, all enqueued; the host has not
        waited yet. Every launch before the host sync delays the payload (the GPU idles while a slow host
        launches), so the sender only packs its routing rows as they are; receivers derive local ids."""
        world = self.ctx.world
        num_tokens, topk = topk_idx.shape
        in_rank = torch.zeros(num_tokens, world, dtype=torch.bool, device=topk_idx.device)
        in_rank.scatter_(1, topk_idx // self._experts_per_rank, True)
        counts = self._counts
        torch.sum(in_rank, dim=0, out=counts[:world])
        dist.all_to_all_single(counts[world:], counts[:world], group=self._group)
        self._counts_host.copy_(counts, non_blocking=True)
        ready = None
        if counts.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        # Behind the copy, so the GPU works on them while the host waits for the counts.
        order = torch.sort(in_rank.t().reshape(-1).logical_not().view(torch.uint8), stable=True).indices
        meta = torch.cat([topk_idx, topk_weights.double().view(torch.int64)], dim=1)  # [T, 2K]
        return _Routed(self._counts_host, ready, order % num_tokens, meta, num_tokens, topk)

    def _splits(self, routed: _Routed) -> tuple[list[int], list[int]]:
        if routed.ready is not None:
            routed.ready.synchronize()  # the one host sync
        both = routed.counts_host.tolist()
        world = self.ctx.world
        return both[:world], both[world:]

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> A2AHandle:
        routed = self._route(topk_idx, topk_weights)
        send_splits, recv_splits = self._splits(routed)
        recv_meta = torch.empty(sum(recv_splits), 2 * routed.topk, dtype=torch.int64, device=topk_idx.device)
        handle = self._handle(routed, send_splits, recv_splits, recv_meta)
        self._exchange([(self._segments(routed.meta_all, handle, None), recv_meta)], send_splits, recv_splits)
        return self._localise(handle, recv_meta)

    def _handle(
        self, routed: _Routed, send_splits: list[int], recv_splits: list[int], recv_meta: torch.Tensor
    ) -> A2AHandle:
        return A2AHandle(
            send_tok=routed.send_tok_all[: sum(send_splits)],
            send_splits=send_splits,
            recv_splits=recv_splits,
            num_tokens=routed.num_tokens,
            recv_topk_idx=recv_meta,  # global ids until _localise
            recv_topk_weights=recv_meta,
        )

    def _localise(self, handle: A2AHandle, recv_meta: torch.Tensor) -> A2AHandle:
        """Received routing rows (global expert ids, weights as float64 bits) to this rank's view: local ids,
        -1 and weight 0 where the expert lives elsewhere. Launched after the payload, under its transfer."""
        k = recv_meta.shape[1] // 2
        epr = self._experts_per_rank
        local = recv_meta[:, :k] - self.ctx.rank * epr
        on_rank = (local >= 0) & (local < epr)
        handle.recv_topk_idx = torch.where(on_rank, local, -1)
        handle.recv_topk_weights = torch.where(on_rank, recv_meta[:, k:].view(torch.float64), 0.0)
        return handle

    # -- the exchange ---------------------------------------------------------------------------------

    def _exchange(
        self,
        pairs: list[tuple[list[torch.Tensor], torch.Tensor]],
        send_splits: list[int],
        recv_splits: list[int],
    ) -> None:
        """Each (per-destination send segments, receive rows) pair in one all_to_all of tensor lists (one
        NCCL group of sends and receives, one Python call: on a slow host each launch counts)."""
        for s_parts, recv in pairs:
            if self._lists:
                dist.all_to_all(list(recv.split(recv_splits)), s_parts, group=self._group)
            else:  # gloo's list all_to_all wants equal sizes: one contiguous send buffer instead
                send = s_parts[0] if len(s_parts) == 1 else torch.cat(s_parts)
                dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self._group)

    def _segments(
        self, src: torch.Tensor, handle: A2AHandle, buffer: torch.Tensor | None
    ) -> list[torch.Tensor]:
        """Per destination, the rows of `src` ([T, W] one per source token) to send: `src` itself where the
        destination takes every token in token order (no gather), else its rows gathered (into `buffer`
        when given, the reused send buffer of the payload)."""
        width = src.shape[1]
        num_send = sum(handle.send_splits)
        if buffer is not None:
            out = buffer[: num_send * width].view(num_send, width).view(src.dtype)
        elif not all(handle.full):
            out = torch.empty(num_send, width, dtype=src.dtype, device=src.device)
        segments = []
        start = 0
        for count, whole in zip(handle.send_splits, handle.full, strict=True):
            if whole:
                segments.append(src)
            else:
                seg = out[start : start + count]
                if count:
                    torch.index_select(src, 0, handle.send_tok[start : start + count], out=seg)
                segments.append(seg)
            start += count
        return segments

    # -- dispatch / combine ---------------------------------------------------------------------------

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        if layout is not None:
            handle: A2AHandle = layout
            recv_x = self._recv_rows(x, handle)
            self._exchange(
                [(self._segments(x, handle, self._send), recv_x)], handle.send_splits, handle.recv_splits
            )
            return Dispatched(recv_x, handle.recv_topk_idx, handle.recv_topk_weights, handle)
        routed = self._route(topk_idx, topk_weights)
        send_splits, recv_splits = self._splits(routed)
        recv_meta = torch.empty(sum(recv_splits), 2 * routed.topk, dtype=torch.int64, device=x.device)
        handle = self._handle(routed, send_splits, recv_splits, recv_meta)
        recv_x = self._recv_rows(x, handle)
        self._exchange(
            [
                (self._segments(x, handle, self._send), recv_x),
                (self._segments(routed.meta_all, handle, None), recv_meta),
            ],
            send_splits,
            recv_splits,
        )
        self._localise(handle, recv_meta)
        return Dispatched(recv_x, handle.recv_topk_idx, handle.recv_topk_weights, handle)

    def _recv_rows(self, x: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        num_recv, width = sum(handle.recv_splits), x.shape[1]
        return self._recv[: num_recv * width].view(num_recv, width).view(x.dtype)

    def combine(self, expert_out: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        return self._sum_at_source(self._exchange_back(expert_out, handle), handle)

    def _exchange_back(self, rows: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Send each received row back to its source rank (splits reversed); rows may be any 2-byte type."""
        num_send, width = sum(handle.send_splits), rows.shape[1]
        back = self._back[: num_send * width].view(num_send, width).view(rows.dtype)
        self._exchange([(list(rows.split(handle.recv_splits)), back)], handle.recv_splits, handle.send_splits)
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
        return {"comm_backend": self.ctx.comm_backend, "nccl_ctas": case.sms}

    def dispatch_with_handle(self, rows: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Send one row per source token (`rows` [T, H], e.g. the gradient of combine's output) to where an
        earlier dispatch sent that token, along its `handle`: [R, H] in that dispatch's received order.

        The backward of combine (moelab.e2e). The rows cross as they are (no quantization), into fresh
        tensors rather than the reused buffers, so the result outlives the next dispatch.
        """
        send = rows.index_select(0, handle.send_tok)
        recv = torch.empty(sum(handle.recv_splits), rows.shape[1], dtype=rows.dtype, device=rows.device)
        self._exchange([(list(send.split(handle.send_splits)), recv)], handle.send_splits, handle.recv_splits)
        return recv
