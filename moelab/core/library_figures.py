"""What a library's test printed (LibraryFigure) and how it compares with moelab's figure (VerifyRow)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

VERDICTS = ("pass", "fail", "error", "missing", "unsupported", "skipped")
FAILING = frozenset({"fail", "error", "missing"})  # verdicts that make `moelab verify` exit 1


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryFigure:
    """One bandwidth line of a library's own benchmark, typed."""

    library: str  # deepep | deepep-ll | hybrid-ep | nccl-tests
    op: str  # moelab's op name: dispatch, combine, pair, alltoall
    dtype: str  # moelab's payload name of the case it belongs to: bf16 | fp8
    label: str  # what the library calls it, e.g. "dispatch BF16, NVL chunk default"
    gbps: float
    time_us: float | None
    timing: str = "api"  # api (events around the call) or kernel (profiler, kernel only)
    size_bytes: int | None = None  # nccl-tests: the per-rank size of the row
    line: str = ""  # the printed line, for the record


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyRow:
    """One library figure beside the moelab figure it must equal; one row of `library_figures`."""

    run_id: str
    backend: str  # the moelab backend whose figure is compared
    library_test: str  # the library's benchmark, e.g. tests/test_intranode.py
    op: str
    dtype: str
    figure: str  # the moelab definition compared (table `definitions`)
    case_id: str | None
    library_label: str | None
    library_gbps: float | None
    moelab_gbps: float | None
    ratio: float | None  # moelab / library
    tolerance: float
    verdict: str
    source_log: str | None  # the library's stdout, relative to the run directory
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VerifyRow:
        fields: dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__}
        return cls(**fields)


def judge(
    library_gbps: float | None, moelab_gbps: float | None, tolerance: float
) -> tuple[float | None, str]:
    """(moelab / library, verdict): pass when the ratio is within 1 ± tolerance; `missing` when moelab has no
    figure, `error` when the library gave none (or a figure that is not a positive number)."""
    if library_gbps is None or not math.isfinite(library_gbps) or library_gbps <= 0:
        return None, "error"
    if moelab_gbps is None or not math.isfinite(moelab_gbps):
        return None, "missing"
    ratio = moelab_gbps / library_gbps
    return ratio, "pass" if abs(ratio - 1.0) <= tolerance else "fail"
