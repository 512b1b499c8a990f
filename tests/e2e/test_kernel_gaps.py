"""benchmarks/kernel_gaps.py on a Chrome trace shaped as torch.profiler writes a CUDA run (CPU runs have no
kernels): the host syncs inside each layer range, and the GPU's idle gaps between the kernels it launched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _trace(tmp_path: Path) -> Path:
    def rt(name: str, ts: float, corr: int | None = None, dur: float = 1.0) -> dict[str, object]:
        args = {} if corr is None else {"correlation": corr}
        return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": args}

    def k(name: str, ts: float, dur: float, corr: int) -> dict[str, object]:
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    events = [
        {"cat": "user_annotation", "name": "moelab/nccl-a2a/layer/c", "ts": 0, "dur": 100},
        rt("cudaLaunchKernel", 1, 1), rt("cudaLaunchKernel", 2, 2), rt("cudaStreamSynchronize", 3, dur=40),
        {"cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 50, "dur": 1, "args": {"correlation": 3}},
        rt("cudaDeviceSynchronize", 95),  # the range's own closing sync: not counted
        k("ncclDevKernel_SendRecv", 10, 20, 1), k("gemm_a", 15, 30, 2), k("triton_permute", 60, 5, 3),
        {"cat": "user_annotation", "name": "moelab/nccl-a2a/layer_serial/c", "ts": 200, "dur": 50},
        rt("cudaLaunchKernel", 201, 4), k("gemm_b", 210, 10, 4),
        k("other_range_kernel", 46, 1, 99),  # launched outside the ranges: not this layer's
    ]  # fmt: skip
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_kernel_gaps_counts_host_syncs_and_idle_gaps(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_gaps.py"), str(_trace(tmp_path))],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    layer, sync, gap, serial = out.splitlines()
    assert "layer/c: host 100 us, 1 host syncs; GPU span 55 us, busy 40 us, idle 15 us in 1 gaps" in layer
    assert sync.strip() == "sync cudaStreamSynchronize 40us"
    assert "15.0 us  after 'gemm_a'  before 'triton_permute'" in gap
    assert "layer_serial/c: host 50 us, 0 host syncs; GPU span 10 us, busy 10 us, idle 0 us" in serial


def test_kernel_gaps_kinds_sums_gemm_and_communication_time(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_gaps.py"), str(_trace(tmp_path)), "--kinds"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    assert lines[1].strip() == (
        "kernels: gemm 30 us, communication 20 us, other 5 us; first GEMM 5 us after the first kernel"
    )
    assert lines[5].strip().startswith("kernels: gemm 10 us, communication 0 us, other 0 us; first GEMM 0 us")
