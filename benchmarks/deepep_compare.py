"""Parse the stdout of DeepEP's own tests/test_intranode.py and Hybrid-EP's tests/test_hybrid_ep.py into
best-figure numbers, to set beside moelab's (same definitions: deepep_common.deepep_nvl_figure and
hybrid_ep_figure).

    python benchmarks/deepep_compare.py deepep intranode.log [--json]
    python benchmarks/deepep_compare.py hybrid-ep hybrid.log [--json]

DeepEP prints, per SM count it tunes (24 in v1.2.1), lines such as
`[tuning] SMs 24, NVL chunk 8: 331.52 GB/s (NVL), avg_t: 258.31 us` and a summary
`[tuning] Best dispatch (BF16): SMs 24, NVL chunk 20, 332.10 GB/s (NVL), t: 257.80 us` (FP8, BF16, then
`Best combine`). Hybrid-EP prints `label: 366.12 GB/s (NVL), t: 229.1 us [min=..., max=...], nvl_recv_bytes: ... MB`
under `=== Torch API Benchmark (BF16|FP8, N ranks) ===` and `label(NVL): 584.20 GB/s, avg_t=143.6 us [...]`
under `=== Kernel Benchmark (...) ===`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

_DEEPEP_TUNING = re.compile(
    r"\[tuning\] SMs (\d+), NVL chunk (\w+): ([\d.]+) GB/s \(NVL\), avg_t: ([\d.]+) us"
)
_DEEPEP_BEST_DISPATCH = re.compile(
    r"\[tuning\] Best dispatch \((BF16|FP8)\): SMs (\d+), NVL chunk (\d+), ([\d.]+) GB/s \(NVL\), t: ([\d.]+) us"
)
_DEEPEP_BEST_COMBINE = re.compile(
    r"\[tuning\] Best combine: SMs (\d+), NVL chunk (\d+): ([\d.]+) GB/s \(NVL\), t: ([\d.]+) us"
)
_DEEPEP_CONFIG = re.compile(r"\[config\] num_tokens=(\d+), hidden=(\d+), num_topk=(\d+)")
_HYBRID_SECTION = re.compile(r"=== (Torch API|Kernel) Benchmark \((BF16|FP8), (\d+) ranks\) ===")
_HYBRID_API = re.compile(
    r"^(.+?):\s+([\d.]+) GB/s \((NVL|RDMA)\), t: ([\d.]+) us \[min=([\d.]+), max=([\d.]+)\](?:, (\w+): ([\d.]+) MB)?"
)
_HYBRID_KERNEL = re.compile(
    r"^(.+?)\((NVL|RDMA)\):\s+([\d.]+) GB/s, avg_t=([\d.]+) us \[min=([\d.]+), max=([\d.]+)\]"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    source: str  # "deepep" or "hybrid-ep"
    op: str  # dispatch, combine, dispatch+permute, fused dispatch+permute, ...
    dtype: str  # BF16 / FP8 payload of dispatch (combine: the run's dtype section for Hybrid-EP, BF16 for DeepEP)
    timing: str  # "api" (events around the call) or "kernel" (kineto, kernel only)
    link: str  # NVL or RDMA
    gbps: float
    time_us: float
    sms: int | None = None
    nvl_chunk: str | None = None
    best: bool = False  # DeepEP's own "Best ..." summary line
    mbytes: float | None = None


def parse_deepep(text: str) -> list[Figure]:
    """Every tuning line and the Best summaries of tests/test_intranode.py. Tuning lines come in the order
    FP8 dispatch, BF16 dispatch, combine (each SM count: chunks 4..32 then `default` for dispatch, 1..16
    then `default` for combine), which is how the op and dtype of a tuning line are known."""
    figures: list[Figure] = []
    phases = iter([("dispatch", "FP8"), ("dispatch", "BF16"), ("combine", "BF16")])
    has_fp8 = "Best dispatch (FP8)" in text or "Running with FP8" in text
    if not has_fp8:
        next(phases)
    op, dtype = next(phases)
    for line in text.splitlines():
        if m := _DEEPEP_BEST_DISPATCH.search(line):
            figures.append(
                Figure(
                    source="deepep",
                    op="dispatch",
                    dtype=m[1],
                    timing="api",
                    link="NVL",
                    gbps=float(m[4]),
                    time_us=float(m[5]),
                    sms=int(m[2]),
                    nvl_chunk=m[3],
                    best=True,
                )
            )
            op, dtype = next(phases, ("combine", "BF16"))
        elif m := _DEEPEP_BEST_COMBINE.search(line):
            figures.append(
                Figure(
                    source="deepep",
                    op="combine",
                    dtype="BF16",
                    timing="api",
                    link="NVL",
                    gbps=float(m[3]),
                    time_us=float(m[4]),
                    sms=int(m[1]),
                    nvl_chunk=m[2],
                    best=True,
                )
            )
        elif m := _DEEPEP_TUNING.search(line):
            figures.append(
                Figure(
                    source="deepep",
                    op=op,
                    dtype=dtype,
                    timing="api",
                    link="NVL",
                    gbps=float(m[3]),
                    time_us=float(m[4]),
                    sms=int(m[1]),
                    nvl_chunk=m[2],
                )
            )
    return figures


def parse_hybrid_ep(text: str) -> list[Figure]:
    figures: list[Figure] = []
    timing, dtype = None, None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _HYBRID_SECTION.search(line):
            timing, dtype = ("api" if m[1] == "Torch API" else "kernel"), m[2]
            continue
        if timing is None or dtype is None:
            continue
        if timing == "api" and (m := _HYBRID_API.match(line)):
            op = re.sub(r"\s*\((BF16|FP8)\)$", "", m[1]).strip()
            figures.append(
                Figure(
                    source="hybrid-ep",
                    op=op,
                    dtype=dtype,
                    timing="api",
                    link=m[3],
                    gbps=float(m[2]),
                    time_us=float(m[4]),
                    mbytes=float(m[8]) if m[8] else None,
                )
            )
        elif timing == "kernel" and (m := _HYBRID_KERNEL.match(line)):
            op = re.sub(r"\s*\((BF16|FP8)\)\s*$", "", m[1].strip()).strip()
            figures.append(
                Figure(
                    source="hybrid-ep",
                    op=op,
                    dtype=dtype,
                    timing="kernel",
                    link=m[2],
                    gbps=float(m[3]),
                    time_us=float(m[4]),
                )
            )
    return figures


def best(figures: list[Figure]) -> dict[str, Figure]:
    """One figure per (op, dtype, timing, link): DeepEP's own Best lines where printed, else the highest."""
    out: dict[str, Figure] = {}
    for f in figures:
        key = f"{f.op}|{f.dtype}|{f.timing}|{f.link}"
        cur = out.get(key)
        if cur is None or (f.best and not cur.best) or (f.best == cur.best and f.gbps > cur.gbps):
            out[key] = f
    return out


def deepep_config(text: str) -> dict[str, int] | None:
    m = _DEEPEP_CONFIG.search(text)
    return {"num_tokens": int(m[1]), "hidden": int(m[2]), "num_topk": int(m[3])} if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", choices=("deepep", "hybrid-ep"))
    ap.add_argument("log", type=Path, help="captured stdout of the library's test")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    text = args.log.read_text(errors="replace")
    figures = parse_deepep(text) if args.source == "deepep" else parse_hybrid_ep(text)
    if not figures:
        print(f"no {args.source} benchmark lines found in {args.log}", file=sys.stderr)
        return 1
    chosen = best(figures)
    if args.json:
        print(
            json.dumps(
                {
                    "config": deepep_config(text) if args.source == "deepep" else None,
                    "best": {k: asdict(v) for k, v in chosen.items()},
                },
                indent=2,
            )
        )
    else:
        for f in chosen.values():
            extra = f" SMs {f.sms} chunk {f.nvl_chunk}" if f.sms is not None else ""
            print(
                f"{f.source:9} {f.op:32} {f.dtype:4} {f.timing:6} {f.link:4} {f.gbps:9.2f} GB/s {f.time_us:9.1f} us{extra}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
