"""Dispatch results whose received row count stays on the GPU.

A backend that never synchronises with the host (torch symmetric memory, NCCL EP with static buffers)
cannot know how many rows it received: it receives into a buffer sized for the worst case and keeps the
count on the device. `PaddedDispatched` carries that buffer and the count; the correctness check reads
the count once (`valid_count`, a host sync outside every timed region) and compares only the valid rows.
Rows past the count carry local expert id -1 and weight 0, so code that groups rows by expert skips them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moelab.backends.base import Dispatched


@dataclass(slots=True, kw_only=True)
class PaddedDispatched(Dispatched):
    """recv_x and the routing tensors hold `capacity` rows; the first `valid_count()` rows are received."""

    recv_counts: torch.Tensor  # [world] rows received from each source rank, on the device

    @property
    def capacity(self) -> int:
        return int(self.recv_x.shape[0])

    def valid_count(self) -> int:
        """The number of received rows: a host synchronisation, for checks only."""
        return int(self.recv_counts.sum().item())


@dataclass(slots=True, kw_only=True)
class SparseDispatched(Dispatched):
    """One row per (source rank, token) slot, only some of them this rank's: an all-gather dispatch (every
    token to every rank, nccl-a2a's `allgather` exchange). A row carries a token for this rank exactly when
    it has a local expert id (>= 0); the others carry expert -1 everywhere and weight 0."""

    @property
    def capacity(self) -> int:
        return int(self.recv_x.shape[0])

    def valid_rows(self) -> torch.Tensor:
        """Positions of the rows received for this rank: a host synchronisation, for checks only."""
        return torch.nonzero((self.recv_topk_idx >= 0).any(dim=1)).squeeze(1)


def received_rows(d: Dispatched) -> Dispatched:
    """`d` with exactly its received rows (a padded result is trimmed to its count, a sparse one keeps its
    rows for this rank; others pass through)."""
    if isinstance(d, SparseDispatched):
        keep = d.valid_rows().to(d.recv_x.device)
        return Dispatched(
            recv_x=d.recv_x[keep],
            recv_topk_idx=d.recv_topk_idx[keep],
            recv_topk_weights=d.recv_topk_weights[keep],
            handle=d.handle,
            recv_scales=None if d.recv_scales is None else d.recv_scales[keep],
        )
    if not isinstance(d, PaddedDispatched):
        return d
    n = d.valid_count()
    return Dispatched(
        recv_x=d.recv_x[:n],
        recv_topk_idx=d.recv_topk_idx[:n],
        recv_topk_weights=d.recv_topk_weights[:n],
        handle=d.handle,
        recv_scales=None if d.recv_scales is None else d.recv_scales[:n],
    )


def pad_rows(rows: torch.Tensor, d: Dispatched) -> torch.Tensor:
    """Rows in received order, zero-padded to a padded result's capacity (combine's input shape); for a
    sparse result, put back at their slots with zero rows elsewhere."""
    if isinstance(d, SparseDispatched) and rows.shape[0] != d.capacity:
        out = torch.zeros(d.capacity, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        out[d.valid_rows().to(rows.device)] = rows
        return out
    if not isinstance(d, PaddedDispatched) or rows.shape[0] == d.capacity:
        return rows
    out = torch.zeros(d.capacity, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
    out[: rows.shape[0]] = rows
    return out
