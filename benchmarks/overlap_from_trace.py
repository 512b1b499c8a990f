"""How much of a layer's communication ran under its compute, read from a moelab torch trace.

    python benchmarks/overlap_from_trace.py RUN_DIR/deepep/traces/CASE/rank0.json [--name layer/]

Kernels are split into communication (NCCL, DeepEP, Hybrid-EP kernels) and compute (everything else); for
each profiled layer range whose name contains --name, it prints the communication kernel time, the part
of it that overlapped a compute kernel on another stream, and when the next micro-batch's first
communication kernel started relative to the end of the compute kernel before it. The evidence for "the
overlap schedule does (not) hide the communication here".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

COMM_MARKS = ("nccl", "deep_ep", "hybrid_ep", "dispatch_kernel", "combine_kernel", "notify")


def is_comm(name: str) -> bool:
    low = name.lower()
    return any(m in low for m in COMM_MARKS)


def overlap_us(a: float, b: float, intervals: list[tuple[float, float]]) -> float:
    total = 0.0
    for x, y in intervals:
        if y <= a:
            continue
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return min(total, b - a)


def layer_overlap(events: list[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel" and start <= e["ts"] <= end), key=lambda e: e["ts"]
    )
    comm = [e for e in kernels if is_comm(e["name"])]
    compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels if not is_comm(e["name"]))
    comm_us = sum(e["dur"] for e in comm)
    hidden = sum(overlap_us(e["ts"], e["ts"] + e["dur"], compute) for e in comm)
    return {"layer_us": end - start, "comm_kernel_us": comm_us, "comm_under_compute_us": hidden,
            "hidden_fraction": hidden / comm_us if comm_us else 0.0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--name", default="/layer/", help="substring of the profiled layer ranges to read")
    a = p.parse_args(argv)
    events = json.loads(a.trace.read_text())["traceEvents"]
    ranges = sorted((e for e in events if e.get("cat") == "user_annotation" and a.name in e.get("name", "")),
                    key=lambda e: e["ts"])  # fmt: skip
    if not ranges:
        print(f"no range containing {a.name!r} in {a.trace}")
        return 1
    for r in ranges:
        o = layer_overlap(events, r["ts"], r["ts"] + r["dur"])
        print(f"{r['name'][:70]}: layer {o['layer_us']:.0f} us, communication kernels {o['comm_kernel_us']:.0f} us, "
              f"under compute {o['comm_under_compute_us']:.0f} us ({100 * o['hidden_fraction']:.0f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
