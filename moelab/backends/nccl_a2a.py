"""`nccl-a2a`: dispatch/combine over torch.distributed collectives (NCCL on GPU, gloo on CPU).

The baseline every library is compared against, so it is written as a careful torch implementation would
be, with two exchanges (knob `exchange`):
- `splits`: exact split sizes. layout = which ranks each token goes to (once per rank, however many of its
  experts live there), the per-rank counts and their exchange, one device-to-host copy of the counts (the
  only host synchronisation: NCCL takes split sizes on the host), then the routing rows (global expert ids,
  weights) sent along the same splits and localised by the receiver. Only the counts are computed before
  the sync; everything else is launched after the payload, under its transfer. dispatch with the layout
  known = one all_to_all of tensor lists (one NCCL group of sends and receives); a destination that
  receives every token in token order is sent `x` itself (no gather), only partial ones gather their rows.
  combine = the rows back along the reversed splits, then a dense sum where a segment holds every token.
- `allgather`: every token to every rank (the worst-case capacity, Megatron-Core's "allgather" token
  dispatcher): dispatch = all_gather of `x`, layout = all_gather of the routing rows, combine =
  reduce_scatter of the expert outputs (sum at the source). No counts and no host sync; the wire carries
  every token to every rank, so it only pays where nearly every token goes to nearly every rank.
- `auto` (default): `allgather` where the case's routing sends at least 95% of all (token, rank) pairs
  (then it moves at most ~5% more bytes than exact splits), else `splits`. The resolved exchange and the
  fill are stored with each case.
--sms maps to NCCL's CTA limits (ncclConfig_t min/max CTAs) of a communicator made per SM count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig, Dispatched, Placement
from moelab.backends.capabilities import (
    BatchedLayout,
    ChainedPairs,
    ColumnCombine,
    DispatchAlongHandle,
    MaskedRouting,
    PartLayouts,
    ZeroSmComm,
)
from moelab.backends.knobs import Knobs, knob
from moelab.backends.padded import SparseDispatched
from moelab.backends.tuning import TuneSpace
from moelab.core.workload import Workload

HOST_SYNC = "one device-to-host copy of the per-rank counts (NCCL takes split sizes on the host)"
EXCHANGES = ("auto", "splits", "allgather")
ALLGATHER_MIN_FILL = 0.95  # auto: all-gather where it moves at most ~5% more than exact splits
# torch >= 2.12 renamed these (the old names warn); older torch (the GPU image's 2.11) has only the old
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def exchange_field() -> Any:
    """Knob `exchange`, declared by nccl-a2a and by the backends built on it."""
    return knob(
        "auto",
        "auto (default) | splits | allgather: exact splits with one host sync, or every token to every rank "
        "with none; auto takes allgather where the routing sends >= 95% of (token, rank) pairs",
        choices=EXCHANGES,
        refusal="{name} must be {want}, not {value!r}",
    )


@dataclass(frozen=True, kw_only=True)
class NcclA2AKnobs(Knobs):
    exchange: str = exchange_field()


def exchange_knob(knobs: Mapping[str, Any]) -> str:
    """The exchange a case asks for (its other knobs are not looked at: mxfp8-a2a shares this one)."""
    return NcclA2AKnobs.parse({k: v for k, v in knobs.items() if k == "exchange"}).exchange


class NcclTuning(TuneSpace):
    """NCCL's CTA limits per communicator; Megatron-Core's all-to-all token dispatcher."""

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Workload) -> list[str]:
        out = []
        if sms is not None:
            out.append(
                f"NCCL: communicator for the expert-parallel all-to-all with ncclConfig_t min_ctas = max_ctas = {sms} "
                f"(torch: ProcessGroupNCCL.Options().config.min_ctas/max_ctas; or NCCL_MIN_CTAS={sms} NCCL_MAX_CTAS={sms})"
            )
        out.append("Megatron-Core: --moe-token-dispatcher-type alltoall")
        return out


def routing_fill(workload: Workload, world: int) -> float:
    """Share of all (token, rank) pairs the case's routing sends: 1.0 when every token goes to every rank.
    Computed on the host from moelab's deterministic routing, outside every timed region."""
    from moelab.core.routing import route_all
    from moelab.core.rows import count_rows

    rows = count_rows(route_all(workload, world), workload.experts_per_rank, world)
    return sum(r.send_rows for r in rows) / (workload.tokens_per_rank * world * world)


def resolve_exchange(knobs: Mapping[str, Any], workload: Workload, world: int) -> tuple[str, float]:
    """(the exchange a case runs, its routing fill)."""
    asked = exchange_knob(knobs)
    fill = routing_fill(workload, world)
    if asked != "auto":
        return asked, fill
    return ("allgather" if fill >= ALLGATHER_MIN_FILL else "splits"), fill


def _routing_rows(topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """[T, 2K] int64: each token's global expert ids, then its weights as float64 bits (one exchange)."""
    return torch.cat([topk_idx, topk_weights.double().view(torch.int64)], dim=1)


@dataclass(slots=True)
class A2AHandle:
    """The layout of one routing: what dispatch needs to move the payload, and combine to bring it back."""

    send_tok: torch.Tensor  # [S] source token of each sent row, destination-major (empty where all full)
    send_splits: list[int]
    recv_splits: list[int]
    num_tokens: int
    recv_topk_idx: torch.Tensor  # [R, K] local expert ids, -1 elsewhere
    recv_topk_weights: torch.Tensor  # [R, K] float64
    gathered: bool = False  # the allgather exchange: R = world * num_tokens, one row per (source, token)
    # (topk_idx, topk_weights) whose routing rows are still to be sent: a handle of `layouts` sends them
    # right behind its payload, so no part's routing exchange runs ahead of the first payload
    unsent_routing: tuple[torch.Tensor, torch.Tensor] | None = None
    views: dict[tuple[int, torch.dtype], tuple[torch.Tensor, list[torch.Tensor]]] = field(
        default_factory=dict
    )  # (width, dtype) -> the receive rows and their per-source parts, in the reused buffer

    @property
    def full(self) -> list[bool]:
        """Per destination: it receives every token in token order, so `x` itself can be sent."""
        return [c == self.num_tokens for c in self.send_splits]


@dataclass(slots=True)
class _Counted:
    """A routing's counts before the host knows them (enqueued ahead of the one host sync)."""

    counts_host: torch.Tensor  # pinned [2W]: send counts, then receive counts
    ready: Any  # a CUDA event behind the count exchange's copy (None on CPU)
    in_rank: torch.Tensor  # [T, W] bool: token t goes to rank w
    num_tokens: int


NCCL_CTA_POLICY_ZERO = 2  # nccl.h: NCCL_CTA_POLICY_DEFAULT 0, _EFFICIENCY 1, _ZERO 2 (NCCL >= 2.28)
ZERO_SM_NCCL = (2, 28)


def nccl_cta_policy_reason() -> str | None:
    """Why this torch cannot make a communicator with NCCL's zero-CTA policy, or None. Kernel-free."""
    pg = getattr(dist, "ProcessGroupNCCL", None)
    if pg is None:
        return f"torch {torch.__version__} is built without NCCL"
    if not hasattr(pg.Options().config, "cta_policy"):
        return (
            f"torch {torch.__version__} does not expose ncclConfig_t.CTAPolicy (ProcessGroupNCCL.Options()"
            ".config.cta_policy), which NCCL_CTA_POLICY_ZERO needs"
        )
    version = tuple(torch.cuda.nccl.version()) if torch.cuda.is_available() else ZERO_SM_NCCL
    if version < ZERO_SM_NCCL:
        return f"NCCL {'.'.join(map(str, version))} has no zero-CTA policy (NCCL >= 2.28)"
    return None


class NcclA2ABackend(
    Backend, BatchedLayout, DispatchAlongHandle, ChainedPairs, MaskedRouting, ZeroSmComm, ColumnCombine
):
    name = "nccl-a2a"
    dispatch_family = "flat"
    dispatch_family_source = "torch.distributed.all_to_all_single over NCCL: each rank sends each peer its rows directly, no forwarding"
    description = (
        "torch.distributed all_to_all with exact splits, or all_gather where every token goes everywhere"
    )
    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control = "NCCL communicator per SM count with ncclConfig min_ctas = max_ctas = sms"
    phases = True
    knobs: ClassVar[type[Knobs]] = NcclA2AKnobs
    tuning: ClassVar[TuneSpace | None] = NcclTuning()
    masked_routing: ClassVar[str] = (
        "a -1 expert sends the token nowhere for that slot; a token with none left is not sent, combine gives it 0"
    )
    column_unit: ClassVar[int] = 8  # any width moves; 16-byte rows keep the grouped GEMM's alignment

    @classmethod
    def zero_sm_reason(cls, comm_backend: str) -> str | None:
        if comm_backend != "nccl":
            return f"e2e comm = zero-sm needs NCCL's zero-CTA policy; {comm_backend} has none"
        return nccl_cta_policy_reason()

    def zero_sm_setting(self) -> str:
        """Moves the prepared case to a communicator made with NCCL_CTA_POLICY_ZERO (made once per job)."""
        key = "zero-sm"
        if key not in self._groups:
            opts = dist.ProcessGroupNCCL.Options()
            setattr(opts.config, "cta_policy", NCCL_CTA_POLICY_ZERO)  # noqa: B010 - newer torch only
            self._groups[key] = dist.new_group(
                ranks=list(range(self.ctx.world)), backend="nccl", pg_options=opts
            )
        self._group = self._groups[key]
        return "NCCL communicator with cta_policy = NCCL_CTA_POLICY_ZERO (zero CTAs wherever NCCL can)"

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
        self._groups: dict[int | str | None, Any] = {None: ctx.group}
        self._group = ctx.group
        self._experts_per_rank = 1
        self._gathered = False
        self._fill = 0.0
        self._lists = ctx.comm_backend == "nccl"  # all_to_all of tensor lists: uneven sizes need NCCL

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        if case.sms is not None and where.comm_backend != "nccl":
            return f"SM control needs NCCL; {where.comm_backend} has none (run sms = default)"
        return super().planned_reason(case, where)

    def prepare(self, case: CaseConfig) -> None:
        self._experts_per_rank = case.workload.experts_per_rank
        exchange, self._fill = resolve_exchange(case.knobs, case.workload, self.ctx.world)
        self._gathered = exchange == "allgather"
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
        if self._gathered:
            return {}
        return {"layout": HOST_SYNC, "dispatch_fresh": HOST_SYNC, "roundtrip": HOST_SYNC}

    # -- layout: exact splits -------------------------------------------------------------------------

    def _count(self, topk_idx: torch.Tensor) -> _Counted:
        """The per-rank counts and their exchange, then the copy the host waits on: the only launches
        ahead of the sync (on a slow host every launch before it delays the payload)."""
        world = self.ctx.world
        num_tokens = topk_idx.shape[0]
        in_rank = self._in_rank(topk_idx)
        counts = self._counts
        torch.sum(in_rank, dim=0, out=counts[:world])
        dist.all_to_all_single(counts[world:], counts[:world], group=self._group)
        self._counts_host.copy_(counts, non_blocking=True)
        ready = None
        if counts.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        return _Counted(self._counts_host, ready, in_rank, num_tokens)

    def _in_rank(self, topk_idx: torch.Tensor) -> torch.Tensor:
        """[T, W] bool: token t goes to rank w (once however many of its experts live there)."""
        world = self.ctx.world
        # a masked slot (-1, MaskedRouting) lands in a spare column that is dropped
        dest = torch.where(topk_idx >= 0, topk_idx // self._experts_per_rank, world)
        in_rank = torch.zeros(topk_idx.shape[0], world + 1, dtype=torch.bool, device=topk_idx.device)
        in_rank.scatter_(1, dest, True)
        return in_rank[:, :world]

    def _handle(self, counted: _Counted, topk: int) -> A2AHandle:
        """Wait for the counts (the one host sync) and lay out the sends. The send order (a stable sort) is
        computed only where a destination takes part of the tokens: where every destination takes every
        token (`x` itself is sent) there is nothing to order."""
        if counted.ready is not None:
            counted.ready.synchronize()
        both = counted.counts_host.tolist()
        world = self.ctx.world
        return self._laid_out(counted.in_rank, both[:world], both[world:], topk)

    @staticmethod
    def _laid_out(
        in_rank: torch.Tensor, send_splits: list[int], recv_splits: list[int], topk: int
    ) -> A2AHandle:
        """The handle of a routing whose splits the host knows: the send order where a destination takes
        part of the tokens."""
        num_tokens = in_rank.shape[0]
        if all(c == num_tokens for c in send_splits):
            send_tok = in_rank.new_empty(0, dtype=torch.int64)
        else:
            flat = in_rank.t().reshape(-1).logical_not().view(torch.uint8)
            order = torch.sort(flat, stable=True).indices[: sum(send_splits)]
            send_tok = order % num_tokens
        empty = torch.empty(0, topk, dtype=torch.int64, device=in_rank.device)
        return A2AHandle(send_tok, send_splits, recv_splits, num_tokens, empty, empty)

    def _send_routing(self, handle: A2AHandle, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """The routing rows (global expert ids, weights as float64 bits) along the payload's splits, then
        localised: launched after the payload, so the host issues them while the GPU moves it."""
        meta = _routing_rows(topk_idx, topk_weights)
        recv_meta = torch.empty(sum(handle.recv_splits), meta.shape[1], dtype=torch.int64, device=meta.device)
        self._exchange(self._segments(meta, handle, None), recv_meta, handle.send_splits, handle.recv_splits)
        self._localise(handle, recv_meta)

    def _localise(self, handle: A2AHandle, recv_meta: torch.Tensor) -> A2AHandle:
        """Received routing rows (global expert ids, weights as float64 bits) to this rank's view: local ids,
        -1 and weight 0 where the expert lives elsewhere."""
        k = recv_meta.shape[1] // 2
        epr = self._experts_per_rank
        local = recv_meta[:, :k] - self.ctx.rank * epr
        on_rank = (local >= 0) & (local < epr)
        handle.recv_topk_idx = torch.where(on_rank, local, -1)
        handle.recv_topk_weights = torch.where(on_rank, recv_meta[:, k:].view(torch.float64), 0.0)
        return handle

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> A2AHandle:
        if self._gathered:
            return self._gather_routing(self._gathered_handle(topk_idx), topk_idx, topk_weights)
        handle = self._handle(self._count(topk_idx), topk_idx.shape[1])
        self._send_routing(handle, topk_idx, topk_weights)
        return handle

    def layouts(self, routings: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> PartLayouts | None:
        """Every part's layout from one exchange of counts and one host read (BatchedLayout): each rank
        sends each peer, per part, how many tokens it sends there and how many (token, slot) pairs go to
        each of the peer's experts; the receiver's splits and pair counts are both in what it receives.
        Each part's routing rows go later, behind its payload (A2AHandle.unsent_routing)."""
        if self._gathered or not routings:
            return None  # no count exchange to fold the pairs into
        world, epr = self.ctx.world, self._experts_per_rank
        total = world * epr
        dev = routings[0][0].device
        # [send | receive][peer][part][tokens, pairs of the peer's expert 0 .. epr-1]
        counts = torch.zeros(2, world, len(routings), 1 + epr, dtype=torch.int64, device=dev)
        in_ranks = []
        for part, (topk_idx, _) in enumerate(routings):
            in_rank = self._in_rank(topk_idx)
            in_ranks.append(in_rank)
            counts[0, :, part, 0] = in_rank.sum(dim=0)
            key = torch.where((topk_idx >= 0) & (topk_idx < total), topk_idx, total).reshape(-1).long()
            pairs = torch.zeros(total + 1, dtype=torch.int64, device=dev).scatter_add_(
                0, key, torch.ones_like(key)
            )
            counts[0, :, part, 1:] = pairs[:total].view(world, epr)
        dist.all_to_all_single(counts[1], counts[0], group=self._group)
        host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=counts.is_cuda)
        host.copy_(counts, non_blocking=counts.is_cuda)
        if counts.is_cuda:
            torch.cuda.current_stream().synchronize()  # the one host sync of every part's layout
        handles, pair_counts = [], []
        for part, ((topk_idx, topk_weights), in_rank) in enumerate(zip(routings, in_ranks, strict=True)):
            send_splits = host[0, :, part, 0].tolist()
            recv_splits = host[1, :, part, 0].tolist()
            handle = self._laid_out(in_rank, send_splits, recv_splits, topk_idx.shape[1])
            handle.unsent_routing = (topk_idx, topk_weights)
            handles.append(handle)
            pair_counts.append(tuple(host[1, :, part, 1:].sum(dim=0).tolist()))
        return PartLayouts(handles=handles, pair_counts=pair_counts)

    # -- layout: all-gather ---------------------------------------------------------------------------

    def _gathered_handle(self, topk_idx: torch.Tensor) -> A2AHandle:
        """Every token to every rank: a slot per (source rank, token), routing rows still to come."""
        num_tokens, world = topk_idx.shape[0], self.ctx.world
        empty = topk_idx.new_empty(0)
        splits = [num_tokens] * world
        return A2AHandle(empty, splits, list(splits), num_tokens, empty, empty, gathered=True)

    def _gather_routing(
        self, handle: A2AHandle, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> A2AHandle:
        """Every rank's routing rows to every rank (no counts, no host sync), localised into `handle`: a
        token that has no expert here is a row with expert -1 everywhere."""
        meta = _routing_rows(topk_idx, topk_weights)
        recv_meta = meta.new_empty(self.ctx.world * meta.shape[0], meta.shape[1])
        _all_gather(recv_meta, meta, group=self._group)
        return self._localise(handle, recv_meta)

    # -- the exchange ---------------------------------------------------------------------------------

    def _exchange(
        self, s_parts: list[torch.Tensor], recv: torch.Tensor, send_splits: list[int], recv_splits: list[int]
    ) -> None:
        """Per-destination send segments into the receive rows: one all_to_all of tensor lists (one NCCL
        group of sends and receives, one Python call: on a slow host each launch counts)."""
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
        full = handle.full
        if all(full):
            return [src] * len(full)
        width = src.shape[1]
        num_send = sum(handle.send_splits)
        if buffer is not None:
            out = buffer[: num_send * width].view(num_send, width).view(src.dtype)
        else:
            out = torch.empty(num_send, width, dtype=src.dtype, device=src.device)
        segments = []
        start = 0
        for count, whole in zip(handle.send_splits, full, strict=True):
            if whole:
                segments.append(src)
            else:
                seg = out[start : start + count]
                if count:
                    torch.index_select(src, 0, handle.send_tok[start : start + count], out=seg)
                segments.append(seg)
            start += count
        return segments

    def _recv_views(self, x: torch.Tensor, handle: A2AHandle) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The receive rows in the reused buffer and their per-source parts, made once per handle."""
        key = (x.shape[1], x.dtype)
        views = handle.views.get(key)
        if views is None:
            num_recv, width = sum(handle.recv_splits), x.shape[1]
            rows = self._recv[: num_recv * width].view(num_recv, width).view(x.dtype)
            views = handle.views[key] = (rows, list(rows.split(handle.recv_splits)))
        return views

    def _send_payload(self, x: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        recv_x, parts = self._recv_views(x, handle)
        if handle.gathered:
            _all_gather(recv_x, x, group=self._group)
        elif self._lists:
            dist.all_to_all(parts, self._segments(x, handle, self._send), group=self._group)
        else:
            self._exchange(
                self._segments(x, handle, self._send), recv_x, handle.send_splits, handle.recv_splits
            )
        return recv_x

    # -- dispatch / combine ---------------------------------------------------------------------------

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        if layout is not None:
            handle: A2AHandle = layout
            recv_x = self._send_payload(x, handle)
            if handle.unsent_routing is not None:  # a handle of `layouts`: its routing follows the payload
                self._send_routing(handle, *handle.unsent_routing)
                handle.unsent_routing = None
        elif self._gathered:
            handle = self._gathered_handle(topk_idx)
            recv_x = self._send_payload(x, handle)  # first: the GPU moves it while the host issues the rest
            self._gather_routing(handle, topk_idx, topk_weights)
        else:
            handle = self._handle(self._count(topk_idx), topk_idx.shape[1])
            recv_x = self._send_payload(x, handle)
            self._send_routing(handle, topk_idx, topk_weights)
        if handle.gathered:
            return SparseDispatched(
                recv_x=recv_x,
                recv_topk_idx=handle.recv_topk_idx,
                recv_topk_weights=handle.recv_topk_weights,
                handle=handle,
            )
        return Dispatched(recv_x, handle.recv_topk_idx, handle.recv_topk_weights, handle)

    def combine(self, expert_out: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        if handle.gathered:
            out = torch.empty(
                handle.num_tokens, expert_out.shape[1], dtype=expert_out.dtype, device=expert_out.device
            )
            _reduce_scatter(out, expert_out.contiguous(), group=self._group)  # the sum at the source
            return out
        return self._sum_at_source(self._exchange_back(expert_out, handle), handle)

    def _exchange_back(self, rows: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Send each received row back to its source rank (splits reversed); rows may be any 2-byte type."""
        num_send, width = sum(handle.send_splits), rows.shape[1]
        back = self._back[: num_send * width].view(num_send, width).view(rows.dtype)
        self._exchange(list(rows.split(handle.recv_splits)), back, handle.recv_splits, handle.send_splits)
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
            "exchange": "allgather" if self._gathered else "splits",
            "routing_fill": round(self._fill, 6),
        }

    def dispatch_with_handle(self, rows: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        """Send one row per source token (`rows` [T, H], e.g. the gradient of combine's output) to where an
        earlier dispatch sent that token, along its `handle`: [R, H] in that dispatch's received order.

        The backward of combine (moelab.measure.e2e). The rows cross as they are (no quantization), into fresh
        tensors rather than the reused buffers, so the result outlives the next dispatch.
        """
        recv = torch.empty(sum(handle.recv_splits), rows.shape[1], dtype=rows.dtype, device=rows.device)
        if handle.gathered:
            _all_gather(recv, rows.contiguous(), group=self._group)
        else:
            self._exchange(self._segments(rows, handle, None), recv, handle.send_splits, handle.recv_splits)
        return recv
