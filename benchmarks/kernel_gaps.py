"""Where the GPU sat idle inside each profiled layer, and the host syncs the layer made, from a moelab torch
trace: does the overlapped layer still wait on the host between kernels?

    python benchmarks/kernel_gaps.py RUN_DIR/nccl-a2a/traces/CASE/rank0.json [--name /layer] [--top 5]

For each profiled range whose name contains --name (the layer's iterations, `moelab run --trace torch`):
- host syncs: CUDA runtime calls that block the host (cudaStreamSynchronize, cudaEventSynchronize,
  a plain cudaMemcpy; not the range's own closing cudaDeviceSynchronize) made inside the range on the host. The overlapped layer reads
  its pair counts once per layer; before issue 37's change it read them once per micro-batch. DeepEP V1's
  fresh dispatch busy-waits on a mapped counter without a runtime call: that shows as a gap only.
- GPU busy / span: the union of every kernel and copy on any stream launched from the range, against
  the time from the first to the last of them; idle = span - busy, and the largest idle gaps with the
  kernels either side (a gap before a GEMM after a dispatch is the host arriving late).
- with --kinds: the GPU time of the range's GEMM kernels, communication kernels and the rest (summed
  over streams: overlapped kernels count in full), and how long after its first kernel the first GEMM
  started. Round 8 read the DeepSeek-V3 tbo layer so (results/h200x2-r8): its micro-batches' GEMMs
  summed to 9.7-10.9 ms against the serial layer's 5.5 ms.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# not cudaDeviceSynchronize: moelab's profiled range ends with one of its own (moelab.tracing.torch_trace)
BLOCKING = ("cudaStreamSynchronize", "cudaEventSynchronize")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def host_syncs(events: list[dict[str, Any]], start: float, end: float) -> list[str]:
    out = []
    for e in events:
        if e.get("cat") != "cuda_runtime" or not start <= e["ts"] <= end:
            continue
        name = e.get("name", "")
        if name in BLOCKING or name == "cudaMemcpy":
            out.append(f"{name} {e.get('dur', 0):.0f}us")
    return out


def gpu_work(events: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    """The kernels and copies launched from the host range [start, end] (matched by correlation id)."""
    launched = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")  # Triton launches through the driver
        and start <= e["ts"] <= end
        and "correlation" in e.get("args", {})
    }
    work = [
        e for e in events if e.get("cat") in GPU_CATS and e.get("args", {}).get("correlation") in launched
    ]
    return sorted(work, key=lambda e: e["ts"])


def gaps(work: list[dict[str, Any]]) -> tuple[float, float, list[tuple[float, str, str]]]:
    """(busy us, span us, idle gaps [(us, kernel before, kernel after)] largest first)."""
    if not work:
        return 0.0, 0.0, []
    busy, idle = 0.0, []
    cur_end, cur_name = work[0]["ts"], ""
    for e in work:
        a, b = e["ts"], e["ts"] + e.get("dur", 0)
        if a > cur_end:
            idle.append((a - cur_end, cur_name, e["name"]))
            busy += b - a
            cur_end, cur_name = b, e["name"]
        elif b > cur_end:
            busy += b - cur_end
            cur_end, cur_name = b, e["name"]
    span = cur_end - work[0]["ts"]
    return busy, span, sorted(idle, reverse=True)


GEMM_WORDS = (
    "gemm",
    "cutlass",
    "xmma",
    "bmm",
    "matmul",
    "nvjet",
)  # moelab.measure.e2e.gemm_choice's, less sm90
COMM_WORDS = ("nccl", "deep_ep", "deepep", "hybrid_ep", "dispatch", "combine")


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    if any(w in name for w in GEMM_WORDS):
        return "gemm"
    if any(w in name for w in COMM_WORDS):
        return "communication"
    return "other"


def kinds(work: list[dict[str, Any]]) -> tuple[dict[str, float], float | None]:
    """GPU us per kind of kernel (summed, overlap counted in full), and us from the first kernel to the
    first GEMM (None without one)."""
    totals = {"gemm": 0.0, "communication": 0.0, "other": 0.0}
    first_gemm = None
    for e in work:
        kind = kind_of(e["name"])
        totals[kind] += e.get("dur", 0)
        if kind == "gemm" and first_gemm is None:
            first_gemm = e["ts"] - work[0]["ts"]
    return totals, first_gemm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--name", default="/layer", help="substring of the profiled layer ranges to read")
    p.add_argument("--top", type=int, default=5, help="largest idle gaps to print per range")
    p.add_argument("--kinds", action="store_true", help="GPU time of GEMM, communication and other kernels")
    a = p.parse_args(argv)
    events = json.loads(a.trace.read_text())["traceEvents"]
    ranges = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and a.name in e.get("name", "")),
        key=lambda e: e["ts"],
    )
    if not ranges:
        print(f"no range containing {a.name!r} in {a.trace}")
        return 1
    for r in ranges:
        start, end = r["ts"], r["ts"] + r["dur"]
        syncs = host_syncs(events, start, end)
        work = gpu_work(events, start, end)
        busy, span, idle = gaps(work)
        print(
            f"{r['name'][:70]}: host {r['dur']:.0f} us, {len(syncs)} host syncs; GPU span {span:.0f} us, "
            f"busy {busy:.0f} us, idle {span - busy:.0f} us in {len(idle)} gaps"
        )
        if a.kinds:
            totals, first_gemm = kinds(work)
            lead = (
                "no GEMM" if first_gemm is None else f"first GEMM {first_gemm:.0f} us after the first kernel"
            )
            print("    kernels: " + ", ".join(f"{k} {v:.0f} us" for k, v in totals.items()) + f"; {lead}")
        for s in syncs:
            print(f"    sync {s}")
        for us, before, after in idle[: a.top]:
            print(f"    gap {us:7.1f} us  after {before[:50]!r}  before {after[:50]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
