"""Each local expert's pair count for every micro-batch of an overlapped layer, read on the host once per
layer, before the first payload.

The grouping of a micro-batch's received rows (moelab.measure.e2e.permute.pair_map) needs its pair count
on the host: it sizes the gather. Read from the received routing, that is a host sync after each dispatch,
mid-pipeline: the host cannot enqueue micro-batch i+1's work until i's dispatch has landed, so the CPU
serialises the overlap. The counts are known before any payload moves: a (token, k) slot routed to global
expert e becomes one pair of e on e's rank (rank e // experts_per_rank), whatever the backend, so each
rank counts its slots per global expert for every micro-batch, one all-reduce sums them over the ranks,
and one host read after the layouts takes them all (the copy is enqueued right behind the all-reduce and
waited on through its own event, so the read does not wait for the layouts' exchanges behind it).

This holds for a backend that delivers every routed slot (the layer's correctness check holds every
backend to that); one that drops slots (a capacity) would need its own counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends.base import Backend


@dataclass(slots=True)
class PendingCounts:
    """Pair counts enqueued on the device; `result()` is the layer's one host read of them."""

    host: torch.Tensor  # [micro-batches, world * experts_per_rank] int64, on the host (pinned on CUDA)
    ready: Any  # a CUDA event behind the copy to `host` (None on CPU: the copy is done)
    first: int  # this rank's first global expert
    experts_per_rank: int

    def result(self) -> list[tuple[int, ...]]:
        """Per micro-batch, each local expert's pair count."""
        if self.ready is not None:
            self.ready.synchronize()
        local = self.host[:, self.first : self.first + self.experts_per_rank]
        return [tuple(row) for row in local.tolist()]  # a host tensor: no device read


def start_pair_counts(
    backend: Backend, routings: Sequence[torch.Tensor], experts_per_rank: int
) -> PendingCounts:
    """Count, sum over the ranks and copy to the host the pairs of every micro-batch (`routings`: each one's
    [T, K] global expert ids, -1 for a masked slot), on the current stream, without waiting for them."""
    ctx = getattr(backend, "ctx", None)  # a backend with no context (a test's loopback) is one rank
    world, rank = (ctx.world, ctx.rank) if ctx is not None else (1, 0)
    total = world * experts_per_rank
    # scatter_add, not torch.bincount: CUDA's bincount reads its input's min and max on the host
    counts = torch.zeros(len(routings), total + 1, dtype=torch.int64, device=routings[0].device)
    for row, i in zip(counts, routings, strict=True):
        key = torch.where((i >= 0) & (i < total), i, total).reshape(-1).long()
        row.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:, :total].contiguous()
    if ctx is not None and world > 1:
        dist.all_reduce(counts, group=ctx.group)
    host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=counts.is_cuda)
    host.copy_(counts, non_blocking=counts.is_cuda)
    ready = None
    if counts.is_cuda:
        ready = torch.cuda.Event()
        ready.record()
    return PendingCounts(
        host=host, ready=ready, first=rank * experts_per_rank, experts_per_rank=experts_per_rank
    )
