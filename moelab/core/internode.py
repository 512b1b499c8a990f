"""Inter-node byte accounting, by DeepEP's conventions, from every rank's routing.

Nodes are groups of `gpus_per_node` consecutive ranks (so one 2-GPU host can be accounted as 2 nodes of
1 GPU). A token goes once to each node that holds at least one of its experts:
- RDMA rows of a rank: unique (token, destination node) pairs, its own node included (DeepEP's RDMA
  figure "contains local rank traffic"); strictly remote: other nodes only, what crosses the NIC.
- NVLink rows of a node, two models:
  * direct: rows between two different ranks of that node in a flat all-to-all (nccl-a2a);
  * forwarded: DeepEP's hierarchical path. A token enters each destination node at the GPU with the
    sender's local index, which forwards it over NVLink to each other rank of that node holding one of
    its experts.
Bytes are rows x bytes per token. The RDMA rows are moelab.core.rows.count_rows' (one counter for
what the store keeps); this module adds the per-node NVLink models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moelab.core.routing import Routing
from moelab.core.rows import count_rows


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRdma:
    rank: int
    node: int
    rdma_rows: int  # (token, destination node) pairs, own node included
    rdma_rows_remote: int  # other nodes only
    rdma_bytes: int
    rdma_bytes_remote: int


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeNvl:
    node: int
    nvl_rows_direct: int  # flat all-to-all: rows between different ranks of this node
    nvl_rows_forwarded: int  # DeepEP hierarchical: rows forwarded by the entry GPU to other ranks here
    nvl_bytes_direct: int
    nvl_bytes_forwarded: int


@dataclass(frozen=True, kw_only=True, slots=True)
class InternodeBytes:
    world: int
    gpus_per_node: int
    bytes_per_token: int
    ranks: tuple[RankRdma, ...]
    nodes: tuple[NodeNvl, ...]


def _check(world: int, gpus_per_node: int, experts_per_rank: int) -> None:
    if gpus_per_node < 1 or experts_per_rank < 1:
        raise ValueError("gpus_per_node and experts_per_rank must be >= 1")
    if world % gpus_per_node:
        raise ValueError(f"world {world} is not a multiple of gpus_per_node {gpus_per_node}")


def destination_ranks(routing: Routing, experts_per_rank: int) -> list[set[int]]:
    """Per token of one rank: the set of ranks holding at least one of its experts."""
    return [{e // experts_per_rank for e in row} for row in routing.topk_idx.tolist()]


def internode_bytes(
    routings: Sequence[Routing], *, experts_per_rank: int, gpus_per_node: int, bytes_per_token: int
) -> InternodeBytes:
    world = len(routings)
    _check(world, gpus_per_node, experts_per_rank)
    num_nodes = world // gpus_per_node
    ranks = []
    direct = [0] * num_nodes
    forwarded = [0] * num_nodes
    for src, routing in enumerate(routings):
        src_node, src_local = divmod(src, gpus_per_node)
        for dests in destination_ranks(routing, experts_per_rank):
            if max(dests) >= world:
                raise ValueError(f"rank {src} routes to an expert beyond {world} ranks x {experts_per_rank}")
            dest_nodes = {d // gpus_per_node for d in dests}
            direct[src_node] += sum(1 for d in dests if d != src and d // gpus_per_node == src_node)
            for node in dest_nodes:
                entry = node * gpus_per_node + src_local
                forwarded[node] += sum(1 for d in dests if d // gpus_per_node == node and d != entry)
    for r in count_rows(routings, experts_per_rank, gpus_per_node):
        ranks.append(
            RankRdma(
                rank=r.rank,
                node=r.rank // gpus_per_node,
                rdma_rows=r.rdma_pairs,
                rdma_rows_remote=r.rdma_pairs_remote,
                rdma_bytes=r.rdma_pairs * bytes_per_token,
                rdma_bytes_remote=r.rdma_pairs_remote * bytes_per_token,
            )  # fmt: skip
        )
    nodes = tuple(
        NodeNvl(
            node=n,
            nvl_rows_direct=direct[n],
            nvl_rows_forwarded=forwarded[n],
            nvl_bytes_direct=direct[n] * bytes_per_token,
            nvl_bytes_forwarded=forwarded[n] * bytes_per_token,
        )
        for n in range(num_nodes)
    )
    return InternodeBytes(
        world=world,
        gpus_per_node=gpus_per_node,
        bytes_per_token=bytes_per_token,
        ranks=tuple(ranks),
        nodes=nodes,
    )
