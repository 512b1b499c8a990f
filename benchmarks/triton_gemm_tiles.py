"""Which tile shapes moelab's Triton grouped GEMM should tune over, on one GPU (issue 37: the grouped GEMM at
the DeepSeek-V3 shape at EP = 2 reads 63-64% of the dense rate, the issue asks 65%).

    python benchmarks/triton_gemm_tiles.py                       # one GPU, DeepSeek-V3 at EP = 2 and 4
    python benchmarks/triton_gemm_tiles.py --shape deepseek-v3:2 --shape reference:2 --json out.json
    python benchmarks/triton_gemm_tiles.py --tiny                # CPU smoke run (triton's interpreter)

For each shape (rank 0's experts and rows under moelab's uniform routing, as benchmarks/grouped_gemm_gpu.py
makes them), it times the FFN's two GEMMs apart, each under every candidate TileConfig (blocks, warps,
pipeline stages, half-height last tiles; moelab.measure.e2e.grouped_gemm.launch), and under the
autotuned launch the layer runs (`tuned`):

- fc1 with the SwiGLU in its epilogue: x [P, H] @ W13 [E, H, 2I] -> silu(gate) * up [P, I];
- fc2: [P, I] @ W2 [E, I, H] -> [P, H].

A configuration the GPU cannot hold (shared memory, registers) is listed with triton's reason. Each output
is checked against the tuned launch's. It prints each GEMM's table (us, TFLOP/s, % of the dense rate) and
the FFN from the best of each against the tuned FFN.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from moelab.core.models import MODELS
from moelab.measure.e2e.grouped_gemm import TileConfig, launch, tuned_tiles, unavailable_reason

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grouped_gemm_gpu import DENSE_N, REFERENCE, dense_tflops, ffn_inputs, queued_us  # noqa: E402

FC1 = [  # BLOCK_N is the gate columns: each tile holds two [BM, BN] accumulators
    TileConfig((128, 128, 64), 8, 3),
    TileConfig((128, 128, 64), 8, 4),
    TileConfig((128, 128, 64), 8, 4, half_tail=False),
    TileConfig((128, 64, 64), 8, 4),
    TileConfig((128, 64, 64), 4, 5),
    TileConfig((64, 128, 64), 4, 4),
    TileConfig((256, 64, 64), 8, 4),
    TileConfig((128, 128, 32), 8, 6),
    TileConfig((128, 64, 128), 8, 3),
]
FC2 = [
    TileConfig((128, 256, 64), 8, 3),
    TileConfig((128, 256, 64), 8, 4),
    TileConfig((128, 256, 64), 8, 4, half_tail=False),
    TileConfig((128, 128, 64), 8, 4),
    TileConfig((128, 128, 64), 4, 5),
    TileConfig((256, 128, 64), 8, 4),
    TileConfig((128, 256, 32), 8, 6),
    TileConfig((128, 256, 32), 8, 6, half_tail=False),
    TileConfig((128, 256, 32), 8, 5),
    TileConfig((128, 256, 32), 8, 7),
    TileConfig((256, 128, 64), 8, 3),
    TileConfig((256, 128, 64), 8, 4, half_tail=False),
    TileConfig((256, 128, 32), 8, 6),
    TileConfig((128, 128, 128), 8, 3),
    TileConfig((64, 256, 64), 4, 4),
]
TINY = [TileConfig((16, 16, 16), 1, 1), TileConfig((32, 16, 16), 1, 1, half_tail=False)]


@dataclass
class Timing:
    shape: str
    ep: int
    gemm: str  # fc1 (SwiGLU fused) or fc2
    config: str  # TileConfig.label(), or "tuned"
    us: float | None
    tflops: float | None
    pct_dense: float | None
    note: str = ""


def shape_args(text: str) -> tuple[str, int]:
    """--shape NAME:EP (NAME a preset of moelab.core.models or `reference`)."""
    name, _, ep = text.partition(":")
    if name not in MODELS and name != REFERENCE[0]:
        raise argparse.ArgumentTypeError(f"{name!r} is not a preset ({', '.join(sorted(MODELS))}, reference)")
    if not ep.isdigit() or int(ep) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME:EP with EP a whole number above 0")
    return name, int(ep)


def dims(name: str, ep: int) -> tuple[int, int, int]:
    """hidden, intermediate, experts per rank."""
    if name == REFERENCE[0]:
        return REFERENCE[1], REFERENCE[2], REFERENCE[3]
    m = MODELS[name]
    return m.hidden, m.intermediate, m.num_experts // ep


def sweep(
    name: str, ep: int, device: torch.device, dense: float, tiny: bool
) -> tuple[list[Timing], dict[str, float]]:
    hidden, inter, epr = (64, 32, 16) if tiny else dims(name, ep)
    inp = ffn_inputs(hidden, inter, epr, ep, device, tokens=64 if tiny else 4096)
    w13, w2 = inp.weights.w13, inp.weights.w2
    act = launch(inp.x, w13, inp.offsets, inp.max_group, swiglu=True)[0]
    gemms = {  # name: (run under a config, FLOPs, candidate configs)
        "fc1": (
            lambda c: launch(inp.x, w13, inp.offsets, inp.max_group, swiglu=True, config=c)[0],
            4.0 * inp.pairs * hidden * inter,
            TINY if tiny else FC1,
        ),
        "fc2": (
            lambda c: launch(act, w2, inp.offsets, inp.max_group, config=c)[0],
            2.0 * inp.pairs * hidden * inter,
            TINY if tiny else FC2,
        ),
    }
    rows: list[Timing] = []
    best: dict[str, float] = {"flops": inp.flops}  # and per GEMM its fastest time, tuned and any config
    for gemm, (run, flops, configs) in gemms.items():
        want = run(None).float()
        for config in [None, *configs]:
            label = "tuned" if config is None else config.label()
            try:
                out = run(config)
                err = float((out.float() - want).norm() / want.norm().clamp(min=1e-12))
                t = queued_us(functools.partial(run, config), device)
            except Exception as exc:  # a config the GPU cannot hold: triton says why; keep the others
                rows.append(
                    Timing(name, ep, gemm, label, None, None, None, f"{type(exc).__name__}: {exc}"[:120])
                )
                continue
            tf = flops / (t * 1e-6) / 1e12
            note = "" if err < 1e-2 else f"WRONG: rel err vs tuned {err:.2e}"
            rows.append(Timing(name, ep, gemm, label, t, tf, tf / dense if dense else None, note))
            if not note:
                best[gemm] = min(best.get(gemm, t), t)
                best.setdefault(f"{gemm} tuned", t)
    return rows, best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=shape_args, action="append", help="NAME:EP (repeatable)")
    p.add_argument("--tiny", action="store_true", help="a CPU smoke run on triton's interpreter")
    p.add_argument("--json", type=Path, help="write every timing here")
    a = p.parse_args()
    if a.tiny:  # before the kernel module is imported (on the first launch): triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    if device.type == "cpu" and not a.tiny:
        p.error("no CUDA device: the sweep times GPU kernels (--tiny runs the CPU smoke test)")
    if not a.tiny and (reason := unavailable_reason(device, 8, 8)):
        p.error(reason)
    dense = dense_tflops(device, 256 if a.tiny else DENSE_N, queued_us)
    print(
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; dense bf16 {dense:.0f} TFLOP/s"
    )
    shapes = [("tiny", 2)] if a.tiny else a.shape or [("deepseek-v3", 2), ("deepseek-v3", 4)]
    everything: list[Timing] = []
    for name, ep in shapes:
        rows, best = sweep(name, ep, device, dense, a.tiny)
        everything += rows
        print(f"\n{name} EP={ep}")
        print(f"{'gemm':5} {'config':24} {'us':>9} {'TF/s':>6} {'%dense':>6}  note")
        for r in rows:
            us = f"{r.us:9.1f}" if r.us is not None else f"{'-':>9}"
            tf = f"{r.tflops:6.0f}" if r.tflops is not None else f"{'-':>6}"
            pct = f"{100 * r.pct_dense:5.1f}%" if r.pct_dense is not None else f"{'-':>6}"
            print(f"{r.gemm:5} {r.config:24} {us} {tf} {pct}  {r.note}")
        if {"fc1", "fc2", "fc1 tuned", "fc2 tuned"} <= best.keys():
            flops = best["flops"]
            for what, t in (
                ("tuned", best["fc1 tuned"] + best["fc2 tuned"]),
                ("best", best["fc1"] + best["fc2"]),
            ):
                rate = flops / (t * 1e-6) / 1e12
                print(f"FFN {what:5} {t:9.1f} us {rate:6.0f} TF/s {100 * rate / dense:5.1f}% of dense")
    print("\nthe autotuner's choices (the record's gemm_triton_tiles):")
    for line in tuned_tiles():
        print(f"  {line}")
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in everything], indent=1))


if __name__ == "__main__":
    main()
