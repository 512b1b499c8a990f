"""Why the expert FFN timed whole read 9-13% above its two GEMMs timed apart (results/h200x1-r18): order,
data dependence, or the GPU's power state? One GPU, about 25 s.

    python benchmarks/gemm_order_power.py            # DeepSeek-V3 EP 2, reference EP 2, DeepSeek-V3 EP 4
    python benchmarks/gemm_order_power.py --reps 100

For each shape (rank 0's experts and rows under moelab's uniform routing, as benchmarks/grouped_gemm_gpu.py
makes them) it runs moelab's Triton grouped GEMMs (fc1 with the SwiGLU fused, fc2) in several orders, an
event between every two kernels, and prints each step's median: each GEMM alone; fc1 -> fc2 with fc2
reading fc1's output (the layer) or a copy made before; fc2 before fc1; each GEMM twice; and the same with
the GPU left idle 20 ms between repetitions, which keeps its SM clock at the maximum. Each phase prints
its wall-clock interval (epoch seconds), so a clock and power log taken beside it (`nvidia-smi
--query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 100`) can be read per phase.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from moelab.core.models import MODELS
from moelab.measure.e2e.grouped_gemm import launch, tuned_tiles, unavailable_reason

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grouped_gemm_gpu import REFERENCE, ffn_inputs, step_times  # noqa: E402

SHAPES = (("deepseek-v3", 2), ("reference", 2), ("deepseek-v3", 4))
IDLE_S = 0.02


def phase(name: str, steps: Sequence[Callable[[], object]], reps: int, idle_s: float = 0.0) -> None:
    """Each rep runs `steps` in order, an event before, between and after (`step_times`); prints the
    median total and each step's median (us), and the phase's wall-clock interval."""
    t0 = time.time()
    times = step_times(steps, reps, 3, torch.device("cuda"), idle_s)
    per = [statistics.median(t) for t in times]
    total = statistics.median(sum(rep) for rep in zip(*times, strict=True))
    cols = " ".join(f"{p:8.1f}" for p in per)
    print(f"  {name:34} total {total:8.1f}  steps {cols} [{t0:.2f}-{time.time():.2f}]", flush=True)


def run_shape(name: str, ep: int, reps: int, device: torch.device) -> None:
    if name == REFERENCE[0]:
        hidden, inter, epr = REFERENCE[1], REFERENCE[2], REFERENCE[3]
    else:
        hidden, inter, epr = MODELS[name].hidden, MODELS[name].intermediate, MODELS[name].num_experts // ep
    inp = ffn_inputs(hidden, inter, epr, ep, device)
    x, w13, w2, off, mg = inp.x, inp.weights.w13, inp.weights.w2, inp.offsets, inp.max_group
    gb = 2 / 1e9
    print(
        f"{name} EP{ep}: pairs {inp.pairs}, largest group {mg}, W13 {w13.numel() * gb:.2f} GB, W2 {w2.numel() * gb:.2f} GB"
    )
    act = launch(x, w13, off, mg, swiglu=True)[0]
    copy = act.clone()
    held: dict[str, torch.Tensor] = {}

    def fc1() -> None:
        held["a"] = launch(x, w13, off, mg, swiglu=True)[0]

    def fc2_of_fc1() -> None:  # reads what fc1 just wrote: the layer's order
        launch(held["a"], w2, off, mg)

    def fc2() -> None:
        launch(act, w2, off, mg)

    def fc2_copy() -> None:
        launch(copy, w2, off, mg)

    fc1()
    fc2()
    torch.cuda.synchronize()
    phase("fc1 alone", [fc1], reps)
    phase("fc2 alone", [fc2], reps)
    phase("fc1 -> fc2 (fc2 reads fc1's output)", [fc1, fc2_of_fc1], reps)
    phase("fc1, fc2 on a copy made before", [fc1, fc2_copy], reps)
    phase("fc2, fc1", [fc2_copy, fc1], reps)
    phase("fc1, fc1", [fc1, fc1], reps)
    phase("fc2, fc2", [fc2, fc2_copy], reps)
    phase(
        f"fc1 -> fc2, {IDLE_S * 1e3:.0f} ms idle between reps", [fc1, fc2_of_fc1], max(reps // 2, 1), IDLE_S
    )
    phase(f"fc1 alone, {IDLE_S * 1e3:.0f} ms idle", [fc1], max(reps // 2, 1), IDLE_S)
    phase(f"fc2 alone, {IDLE_S * 1e3:.0f} ms idle", [fc2], max(reps // 2, 1), IDLE_S)
    phase("fc1 -> fc2 again", [fc1, fc2_of_fc1], reps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=60, help="repetitions per phase (half with idle gaps)")
    a = p.parse_args()
    if a.reps < 1:
        p.error("--reps must be at least 1")
    if not torch.cuda.is_available():
        p.error("no CUDA device: this benchmark times GPU kernels and the GPU's power state")
    device = torch.device("cuda")
    if reason := unavailable_reason(device, 8, 8):
        p.error(reason)
    for name, ep in SHAPES:
        run_shape(name, ep, a.reps, device)
        torch.cuda.empty_cache()
    print("the autotuner's choices:", *tuned_tiles(), sep="\n  ")


if __name__ == "__main__":
    main()
