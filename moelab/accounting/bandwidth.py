"""Byte accounting per rank, by the libraries' own conventions (DESIGN.md "What is measured").

Rows are (token, destination rank) pairs: a token goes once to each rank that holds at least one of its
experts. Nodes are groups of `gpus_per_node` consecutive ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moelab.accounting.rows import RankRows, count_rows
from moelab.record.case_record import Figure

__all__ = ["DEFINITIONS", "Bandwidth", "Definition", "Figure", "RankRows", "bandwidths", "count_rows"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Definition:
    name: str
    rows_field: str
    text: str
    source: str = "time"  # "time": rows x bytes over the op's median; "kernel": over its kernel-only time; "external": another tool's own figure


DEFINITIONS: dict[str, Definition] = {
    d.name: d
    for d in (
        Definition(
            name="nvl_recv",
            rows_field="recv_rows",
            text="DeepEP 'NVL': rows this rank receives in dispatch (its own included) x bytes/token / time; combine: the same rows sent back",
        ),
        Definition(
            name="nvl_remote",
            rows_field="recv_rows_remote",
            text="as nvl_recv but rows from (combine: to) other ranks only: what crosses NVLink or the network",
        ),
        Definition(
            name="rdma_pairs",
            rows_field="rdma_pairs",
            text="DeepEP 'RDMA': unique (token, destination node) pairs of this rank, its own node included, x bytes/token / time",
        ),
        Definition(
            name="rdma_remote",
            rows_field="rdma_pairs_remote",
            text="as rdma_pairs but other nodes only: what crosses the NIC",
        ),
        Definition(
            name="nvl_recv_kernel",
            source="kernel",
            rows_field="recv_rows",
            text="as nvl_recv, over the kernel-only time from a profiler trace (the union of the op's GPU kernels) instead of the event-timed API time",
        ),
        Definition(
            name="nvl_remote_kernel",
            source="kernel",
            rows_field="recv_rows_remote",
            text="as nvl_remote, over the kernel-only time from a profiler trace",
        ),
        Definition(
            name="nccl_algbw",
            source="external",
            rows_field="send_rows",
            text="nccl-tests alltoall_perf algbw (out-of-place): size / time, size = the per-rank send buffer over all peers",
        ),
        Definition(
            name="nccl_busbw",
            source="external",
            rows_field="send_rows",
            text="nccl-tests alltoall_perf busbw (out-of-place): algbw x (n-1)/n",
        ),
        Definition(
            name="algbw_send",
            rows_field="send_rows",
            text="algorithm bandwidth: rows this rank sends (its own included) x bytes/token / time, as nccl-tests' algbw for an all-to-all of that size",
        ),
    )
}


Bandwidth = Figure  # one figure of one op under a named definition


def bandwidths(
    rows: Sequence[RankRows], bytes_per_row: int, time_us: float, source: str = "time"
) -> list[Bandwidth]:
    """Every definition of `source` over `time_us` (the op's median, or its kernel-only time)."""
    result = []
    for d in DEFINITIONS.values():
        if d.source != source:
            continue
        per_rank = [getattr(r, d.rows_field) * bytes_per_row for r in rows]
        mean = sum(per_rank) / len(per_rank)
        gbps = mean / (time_us * 1e-6) / 1e9 if time_us > 0 else float("nan")
        result.append(
            Bandwidth(definition=d.name, bytes_mean=mean, bytes_max=float(max(per_rank)), gbps=gbps)
        )
    return result
