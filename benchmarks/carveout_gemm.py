"""What an SM carve-out costs the expert GEMMs of the e2e layer: one micro-batch's SwiGLU grouped GEMMs
(moelab.measure.e2e.layer.swiglu_ffn) timed with 0, 8, 16, 24, 32 SMs held back (moelab.measure.e2e.carveout), on one GPU.

    python benchmarks/carveout_gemm.py --hidden 8192 --pairs 16384 --experts 8 --carveouts 0,8,16,24,32

A GEMM that honours the carve-out slows by about total / (total - carveout); one that ignores it does
not slow at all, and then no carve-out can make room for communication beside it.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from moelab.core.e2e_spec import default_intermediate
from moelab.measure.e2e.carveout import gemm_carveout
from moelab.measure.e2e.layer import local_expert_weights, swiglu_ffn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument(
        "--pairs", type=int, default=16384, help="(row, expert) pairs: half of the reference rank's"
    )
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--carveouts", default="0,8,16,24,32")
    p.add_argument("--iters", type=int, default=30)
    a = p.parse_args()
    device = torch.device("cuda", 0)
    inter = default_intermediate(a.hidden)
    weights = local_expert_weights(0, 0, a.experts, a.hidden, inter, device)
    x = torch.randn(a.pairs, a.hidden, device=device, dtype=torch.bfloat16)
    per = a.pairs // a.experts
    offsets = torch.arange(1, a.experts + 1, device=device, dtype=torch.int32) * per
    total = torch.cuda.get_device_properties(device).multi_processor_count
    base = None
    print(f"GPU {torch.cuda.get_device_name(device)} ({total} SMs), torch {torch.__version__}")
    for carve in (int(c) for c in a.carveouts.split(",")):
        with gemm_carveout(carve, device):
            for _ in range(5):
                swiglu_ffn(x, offsets, weights, "grouped")
            times = []
            for _ in range(a.iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                swiglu_ffn(x, offsets, weights, "grouped")
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
        med = statistics.median(times)
        base = base or med
        ideal = total / (total - carve)
        print(f"carveout {carve:3d} SMs: {med:9.1f} us  x{med / base:5.3f}  (x{ideal:5.3f} if it honours it)")


if __name__ == "__main__":
    main()
