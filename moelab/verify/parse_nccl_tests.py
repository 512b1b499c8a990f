"""alltoall_perf's table (parsed by moelab.backends.nccl_tests, shared with the nccl-tests backend) as figures."""

from __future__ import annotations

from moelab.backends.nccl_tests import parse_text
from moelab.core.library_figures import LibraryFigure


def figures(text: str, dtype: str) -> list[LibraryFigure]:
    """The out-of-place algbw and busbw of each size (verify runs one size per invocation)."""
    out = []
    for row in parse_text(text).rows:
        for name, gbps in (("algbw", row.algbw_gbps_oop), ("busbw", row.busbw_gbps_oop)):
            if gbps is not None:
                out.append(LibraryFigure(library="nccl-tests", op="alltoall", dtype=dtype, label=f"{row.size_bytes} B {name}",
                                         gbps=gbps, time_us=row.time_us_oop, size_bytes=row.size_bytes))  # fmt: skip
    return out
