"""Byte accounting per rank, by the libraries' own conventions (docs/design.md, "What is measured").

Rows are (token, destination rank) pairs: a token goes once to each rank that holds at least one of its
experts. Nodes are groups of `gpus_per_node` consecutive ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from moelab.core.case_record import Figure
from moelab.core.definitions import DEFINITIONS, Definition
from moelab.core.rows import RankRows, count_rows

__all__ = ["DEFINITIONS", "Bandwidth", "Definition", "Figure", "RankRows", "bandwidths", "count_rows"]


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
