"""The device-side routing math of `torch-symm-a2a`, in plain torch so it runs (and is tested) on the CPU.

A send row is one (token, destination rank) pair, rows sorted by destination rank and, within a rank, by
token. Every row of the exchanged buffer holds the token's payload followed by its routing metadata
(local expert ids as int32, -1 where the expert lives elsewhere, and float32 weights), so one
all-to-all carries both. Nothing here reads a value back to the host: the buffers are sized for the
worst case (every token to every rank) and the rows past the real count are marked, not trimmed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROW_ALIGN_COLS = 32  # bf16 columns: rows stay a multiple of 64 bytes
META_COLS_PER_TOPK = 4  # one int32 id and one float32 weight per top-k slot, two bf16 columns each
SPARE_ROWS = 64  # scratch rows that absorb combine's unsent slots (spread to avoid atomics on one row)
# torch's CUDA all_to_all_vdev (the pull version, torch <= 2.11 at least) splits each peer's bytes evenly over
# num_blocks // world thread blocks and traps unless they divide exactly; num_blocks is
# min(round_up(ceil(buffer bytes / 64 KiB), world), 64 on NVLink or 16 across nodes). A buffer of at least
# EXCHANGE_MIN_BYTES pins num_blocks at its cap, and rows padded to a multiple of every blocks-per-peer
# that cap can give keep each peer's bytes divisible.
EXCHANGE_BLOCK_BYTES = 16 * 512 * 8
EXCHANGE_MAX_BLOCKS = (64, 16)
EXCHANGE_MIN_BYTES = max(EXCHANGE_MAX_BLOCKS) * EXCHANGE_BLOCK_BYTES


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def exchange_align_cols(world: int) -> int:
    """bf16 columns a row must be a multiple of, so that every peer's bytes split evenly over its blocks."""
    align_bytes = 2 * ROW_ALIGN_COLS
    for cap in EXCHANGE_MAX_BLOCKS:
        align_bytes = math.lcm(align_bytes, max(cap // world, 1))
    return align_bytes // 2


def buffer_rows(capacity: int, width: int) -> int:
    """Rows to allocate for `capacity` rows of `width` bf16 columns: at least EXCHANGE_MIN_BYTES."""
    return max(capacity, -(-EXCHANGE_MIN_BYTES // (2 * width)))


@dataclass(frozen=True, slots=True)
class RowLayout:
    """Columns of one exchanged row, in bf16 units: payload [0, hidden), metadata [meta_start, width)."""

    hidden: int
    topk: int
    align_cols: int = ROW_ALIGN_COLS  # exchange_align_cols(world)

    @property
    def meta_cols(self) -> int:
        return META_COLS_PER_TOPK * self.topk

    @property
    def width(self) -> int:
        return round_up(self.hidden + self.meta_cols, self.align_cols)

    @property
    def back_width(self) -> int:
        """Columns of combine's rows (payload only), aligned the same way."""
        return round_up(self.hidden, self.align_cols)

    @property
    def meta_start(self) -> int:
        return self.width - self.meta_cols

    def payload(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[:, : self.hidden]

    def meta(self, rows: torch.Tensor) -> torch.Tensor:
        """The metadata columns as int32 [rows, 2*topk]: ids, then the weights' float32 bits."""
        return rows[:, self.meta_start :].view(torch.int32)


def meta_ids(meta: torch.Tensor, topk: int) -> torch.Tensor:
    return meta[:, :topk]


def meta_weights(meta: torch.Tensor, topk: int) -> torch.Tensor:
    return meta[:, topk:].view(torch.float32)


@dataclass(frozen=True, slots=True)
class SymmLayout:
    """What a dispatch of one routing needs, all on the routing's device; valid for any number of
    dispatches of that routing. Rows past sum(send_counts) are padding."""

    send_counts: torch.Tensor  # [world] int64 rows to each destination rank
    gather_idx: torch.Tensor  # [capacity] int64 source token of each send row (0 on padding)
    scatter_idx: torch.Tensor  # [capacity] int64 the same, and num_tokens + spare row on padding
    meta: torch.Tensor  # [capacity, 2*topk] int32 per send row: local ids, float32 weight bits
    num_tokens: int
    topk: int


def plan_layout(
    topk_idx: torch.Tensor, topk_weights: torch.Tensor, world: int, experts_per_rank: int, capacity: int
) -> SymmLayout:
    """Send rows of a routing, padded to `capacity` (>= tokens * world) rows, with no host sync."""
    num_tokens, topk = topk_idx.shape
    if capacity < num_tokens * world:
        raise ValueError(f"capacity {capacity} < tokens {num_tokens} x world {world}")
    dev = topk_idx.device
    dest = topk_idx // experts_per_rank
    in_rank = torch.zeros(num_tokens, world, dtype=torch.bool, device=dev)
    in_rank.scatter_(1, dest, True)
    send_counts = in_rank.sum(dim=0)
    flat = in_rank.t().reshape(-1)  # (destination rank, token) order
    order = torch.sort(flat.logical_not().to(torch.uint8), stable=True).indices  # sent pairs first
    sent = flat.index_select(0, order)
    token = order % num_tokens
    rank = order // num_tokens
    pad = capacity - order.numel()
    spare = num_tokens + torch.arange(capacity, device=dev)[: order.numel()] % SPARE_ROWS
    gather_idx = torch.where(sent, token, 0)
    scatter_idx = torch.where(sent, token, spare)
    local = topk_idx.index_select(0, token) - (rank * experts_per_rank).unsqueeze(1)
    on_dest = (local >= 0) & (local < experts_per_rank) & sent.unsqueeze(1)
    weights = topk_weights.index_select(0, token).to(torch.float32)
    meta = torch.cat(
        [
            torch.where(on_dest, local, -1).to(torch.int32),
            torch.where(on_dest, weights, 0.0).view(torch.int32),
        ],
        dim=1,
    )
    if pad:
        gather_idx = torch.cat([gather_idx, torch.zeros(pad, dtype=gather_idx.dtype, device=dev)])
        spare_pad = num_tokens + torch.arange(pad, device=dev) % SPARE_ROWS
        scatter_idx = torch.cat([scatter_idx, spare_pad])
        meta = torch.cat([meta, empty_meta(pad, topk, dev)])
    return SymmLayout(send_counts, gather_idx, scatter_idx, meta, num_tokens, topk)


def empty_meta(rows: int, topk: int, device: torch.device) -> torch.Tensor:
    """Metadata of rows that carry no token: ids -1, weights 0."""
    meta = torch.zeros(rows, 2 * topk, dtype=torch.int32, device=device)
    meta[:, :topk] = -1
    return meta


def mask_received_meta(
    meta: torch.Tensor,
    recv_counts: torch.Tensor,
    out: torch.Tensor,
    row_ids: torch.Tensor | None = None,
    fill: torch.Tensor | None = None,
) -> torch.Tensor:
    """Received metadata with rows past sum(recv_counts) set to no expert (ids -1, weights 0), into `out`.
    `row_ids` (arange of the rows) and `fill` (empty_meta(1, topk)) may be passed in to reuse them."""
    rows, cols = meta.shape
    row_ids = torch.arange(rows, device=meta.device) if row_ids is None else row_ids
    fill = empty_meta(1, cols // 2, meta.device) if fill is None else fill
    valid = row_ids < recv_counts.sum()
    return torch.where(valid.unsqueeze(1), meta, fill, out=out)


def sum_at_source(back: torch.Tensor, layout: SymmLayout, out: torch.Tensor) -> torch.Tensor:
    """Sum the rows sent back (in send order) per source token; `out` has num_tokens + SPARE_ROWS rows."""
    out.zero_()
    out.index_add_(0, layout.scatter_idx, back)
    return out[: layout.num_tokens]
