"""Rows per rank: (token, destination rank) pairs, the unit every byte figure counts.

A token goes once to each rank that holds at least one of its experts; nodes are groups of
`gpus_per_node` consecutive ranks. torch is imported only where rows are counted, so the record and the
store can use RankRows without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moelab.core.routing import Routing


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRows:
    rank: int
    recv_rows: int  # rows this rank receives in dispatch, its own included
    recv_rows_remote: int  # ... from other ranks only
    send_rows: int  # rows this rank sends in dispatch, to itself included
    send_rows_remote: int
    rdma_pairs: int  # unique (token, destination node) pairs of this rank's tokens, own node included
    rdma_pairs_remote: int  # ... other nodes only


def count_rows(routings: Sequence[Routing], experts_per_rank: int, gpus_per_node: int) -> list[RankRows]:
    import torch

    world = len(routings)
    in_rank = []  # [src] -> bool [T, W]
    for r in routings:
        dest = r.topk_idx.cpu() // experts_per_rank
        mask = torch.zeros(dest.shape[0], world, dtype=torch.bool)
        mask.scatter_(1, dest, True)
        in_rank.append(mask)
    per_src_to_dst = torch.stack([m.sum(dim=0) for m in in_rank])  # [src, dst]
    node_of = torch.arange(world) // gpus_per_node
    num_nodes = int(node_of.max().item()) + 1
    out = []
    for rank in range(world):
        mask = in_rank[rank]
        in_node = torch.zeros(mask.shape[0], num_nodes, dtype=torch.bool)
        for node in range(num_nodes):
            in_node[:, node] = mask[:, node_of == node].any(dim=1)
        own = int(node_of[rank])
        out.append(
            RankRows(
                rank=rank,
                recv_rows=int(per_src_to_dst[:, rank].sum()),
                recv_rows_remote=int(per_src_to_dst[:, rank].sum() - per_src_to_dst[rank, rank]),
                send_rows=int(per_src_to_dst[rank, :].sum()),
                send_rows_remote=int(per_src_to_dst[rank, :].sum() - per_src_to_dst[rank, rank]),
                rdma_pairs=int(in_node.sum()),
                rdma_pairs_remote=int(in_node.sum() - in_node[:, own].sum()),
            )
        )
    return out
