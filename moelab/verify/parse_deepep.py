"""DeepEP V1's own tests, as printed by tag v1.2.1.

tests/test_intranode.py tunes at 24 SMs (`for i in (24, )`), over NVL chunk sizes, in the order FP8
dispatch (when SM90 features are compiled in), BF16 dispatch, combine; each ends with its `default` chunk
(`Buffer.get_dispatch_config` / `get_combine_config`, what a user gets) and then a `Best ...` summary:

    [tuning] SMs 24, NVL chunk 8: 331.52 GB/s (NVL), avg_t: 258.31 us
    [tuning] SMs 24, NVL chunk default: 332.16 GB/s (NVL), avg_t: 353.57 us
    [tuning] Best dispatch (BF16): SMs 24, NVL chunk 24, 332.48 GB/s (NVL), t: 353.22 us
    [tuning] Best combine: SMs 24, NVL chunk 8: 297.38 GB/s (NVL), t: 394.91 us

Figure = rank 0's received bytes (BF16: rows x hidden x 2; FP8: that x (1 + 4/128) / 2) over rank 0's mean
time after dropping the first of 50 iterations, cached handle: moelab's `deepep_nvl`. verify uses the
default-chunk lines: moelab runs DeepEP's recommended config, not the best of a tuning sweep.

tests/test_low_latency.py prints per rank `[rank R] Dispatch + combine bandwidth: X GB/s, avg_t=.. us, ...`
(events around FP8 dispatch + combine, every (token, expert) selection counted) and kernel-only
(kineto) per-op lines `[rank R] Dispatch bandwidth: X GB/s, avg_t=.. us | Combine bandwidth: ...`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moelab.core.library_figures import LibraryFigure

TEST_INTRANODE = "tests/test_intranode.py"
TEST_LOW_LATENCY = "tests/test_low_latency.py"
INTRANODE_SMS = 24  # test_intranode.py test_loop: `for i in (24, ):` the only SM count it runs

_TUNING = re.compile(r"\[tuning\] SMs (\d+), NVL chunk (\w+): ([\d.]+) GB/s \(NVL\), avg_t: ([\d.]+) us")
_BEST_DISPATCH = re.compile(
    r"\[tuning\] Best dispatch \((BF16|FP8)\): SMs (\d+), NVL chunk (\d+), ([\d.]+) GB/s \(NVL\), t: ([\d.]+) us"
)
_BEST_COMBINE = re.compile(
    r"\[tuning\] Best combine: SMs (\d+), NVL chunk (\d+): ([\d.]+) GB/s \(NVL\), t: ([\d.]+) us"
)
_CONFIG = re.compile(r"\[config\] num_tokens=(\d+), hidden=(\d+), num_topk=(\d+)")
_LL_PAIR = re.compile(r"\[rank (\d+)\] Dispatch \+ combine bandwidth: ([\d.]+) GB/s, avg_t=([\d.]+) us")
_LL_KERNEL = re.compile(
    r"\[rank (\d+)\] Dispatch bandwidth: ([\d.]+) GB/s, avg_t=([\d.]+) us \| "
    r"Combine bandwidth: ([\d.]+) GB/s, avg_t=([\d.]+) us"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class TuningLine:
    """One line of test_intranode.py's tuning output."""

    op: str  # dispatch | combine
    dtype: str  # bf16 | fp8 (combine: bf16)
    sms: int
    nvl_chunk: str  # "4".."32" or "default"
    gbps: float
    time_us: float
    best: bool  # the `Best ...` summary line
    line: str


def parse_intranode(text: str) -> list[TuningLine]:
    """Every tuning line and Best summary, with the op and dtype each belongs to (known from the order of
    the phases, which the Best lines close)."""
    has_fp8 = "Best dispatch (FP8)" in text or "Running with FP8" in text
    phases = iter(([("dispatch", "fp8")] if has_fp8 else []) + [("dispatch", "bf16"), ("combine", "bf16")])
    op, dtype = next(phases)
    out: list[TuningLine] = []
    for raw in text.splitlines():
        line = raw.strip()
        if m := _BEST_DISPATCH.search(line):
            out.append(TuningLine(op="dispatch", dtype=m[1].lower(), sms=int(m[2]), nvl_chunk=m[3],
                                  gbps=float(m[4]), time_us=float(m[5]), best=True, line=line))  # fmt: skip
            op, dtype = next(phases, ("combine", "bf16"))
        elif m := _BEST_COMBINE.search(line):
            out.append(TuningLine(op="combine", dtype="bf16", sms=int(m[1]), nvl_chunk=m[2],
                                  gbps=float(m[3]), time_us=float(m[4]), best=True, line=line))  # fmt: skip
        elif m := _TUNING.search(line):
            out.append(TuningLine(op=op, dtype=dtype, sms=int(m[1]), nvl_chunk=m[2],
                                  gbps=float(m[3]), time_us=float(m[4]), best=False, line=line))  # fmt: skip
    return out


def intranode_figures(text: str) -> list[LibraryFigure]:
    """The default-chunk figures (one per op and dtype), not the best of the tuning sweep."""
    return [
        LibraryFigure(
            library="deepep",
            op=t.op,
            dtype=t.dtype,
            label=f"{t.op} {t.dtype.upper()}, SMs {t.sms}, NVL chunk default",
            gbps=t.gbps,
            time_us=t.time_us,
            line=t.line,
        )  # fmt: skip
        for t in parse_intranode(text)
        if t.nvl_chunk == "default" and not t.best
    ]


def intranode_config(text: str) -> dict[str, int] | None:
    m = _CONFIG.search(text)
    return {"num_tokens": int(m[1]), "hidden": int(m[2]), "num_topk": int(m[3])} if m else None


def low_latency_figures(text: str, rank: int = 0) -> list[LibraryFigure]:
    """Rank `rank`'s figures: the event-timed FP8 dispatch + combine pair, and the kernel-only per-op ones."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if (m := _LL_PAIR.search(line)) and int(m[1]) == rank:
            out.append(LibraryFigure(library="deepep-ll", op="pair", dtype="fp8", label="dispatch + combine (FP8 dispatch)",
                                     gbps=float(m[2]), time_us=float(m[3]), line=line))  # fmt: skip
        elif (m := _LL_KERNEL.search(line)) and int(m[1]) == rank:
            out.append(LibraryFigure(library="deepep-ll", op="dispatch", dtype="fp8", label="dispatch kernel (FP8)",
                                     gbps=float(m[2]), time_us=float(m[3]), timing="kernel", line=line))  # fmt: skip
            out.append(LibraryFigure(library="deepep-ll", op="combine", dtype="fp8", label="combine kernel",
                                     gbps=float(m[4]), time_us=float(m[5]), timing="kernel", line=line))  # fmt: skip
    return out
