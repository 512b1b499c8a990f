"""Byte accounting per rank, by the libraries' own conventions (DESIGN.md "What is measured").

Rows are (token, destination rank) pairs: a token goes once to each rank that holds at least one of its
experts. Nodes are groups of `gpus_per_node` consecutive ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from moelab.accounting.definitions import DEFINITIONS, Definition
from moelab.plan.routing import Routing

__all__ = ["DEFINITIONS", "Bandwidth", "Definition", "RankRows", "bandwidths", "count_rows", "library_figure"]


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Bandwidth:
    definition: str
    bytes_mean: float  # per rank
    bytes_max: float
    gbps: float  # bytes_mean / time, GB = 1e9 bytes as DeepEP and nccl-tests print


def bandwidths(rows: Sequence[RankRows], bytes_per_row: int, time_us: float) -> list[Bandwidth]:
    result = []
    for d in DEFINITIONS.values():
        if d.name.endswith("_kernel") or d.name.startswith(("nccl_", "deepep_", "hybrid_ep_")):
            continue  # derived from other inputs (trace time, alltoall_perf's own figures)
        per_rank = [getattr(r, d.rows_field) * bytes_per_row for r in rows]
        mean = sum(per_rank) / len(per_rank)
        gbps = mean / (time_us * 1e-6) / 1e9 if time_us > 0 else float("nan")
        result.append(
            Bandwidth(definition=d.name, bytes_mean=mean, bytes_max=float(max(per_rank)), gbps=gbps)
        )
    return result


def library_figure(
    backend: str, rows: Sequence[RankRows], bytes_per_row: int, samples_us: Sequence[Sequence[float]]
) -> Bandwidth | None:
    """The figure a library's own test prints, computed its way from moelab's per-rank samples (None when the
    backend's library has no such test). DeepEP: rank 0's bytes over rank 0's mean after dropping the first
    sample; Hybrid-EP: rank 0's bytes over the mean across ranks of each rank's mean time."""
    rank0 = rows[0].recv_rows * bytes_per_row
    if backend == "deepep":
        kept = list(samples_us[0][1:]) or list(samples_us[0])
        t = sum(kept) / len(kept)
        name = "deepep_nvl"
    elif backend == "hybrid-ep":
        t = sum(sum(s) / len(s) for s in samples_us) / len(samples_us)
        name = "hybrid_ep_rank0_bytes_over_mean_time"
    else:
        return None
    return Bandwidth(
        definition=name, bytes_mean=float(rank0), bytes_max=float(rank0), gbps=rank0 / (t * 1e-6) / 1e9
    )
