"""Where the e2e layer's expert compute spends its time, kernel by kernel: one shape at EP = 1 under
torch.profiler, forward+backward of the expert compute (grouping, permute, GEMMs, SwiGLU, un-permute),
the kernels listed by total GPU time with their share, and the time outside the grouped GEMMs.

    python benchmarks/e2e_profile_gpu.py --shape mixtral-8x7b --tokens 4096

It reuses benchmarks/e2e_layer_gpu.py's single-rank set-up, so it measures exactly what that one times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_layer_gpu import shape_backend, shapes, single_rank_context  # noqa: E402

from moelab.core.workload import Workload  # noqa: E402
from moelab.measure.e2e.correctness import make_layer_inputs  # noqa: E402
from moelab.measure.e2e.layer import group_by_expert, output_grad, resolve_gemm  # noqa: E402
from moelab.measure.e2e.permute import resolve_permute, unpermute  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="mixtral-8x7b")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    ctx = single_rank_context()
    (m,) = shapes(a.tiny, [a.shape])
    wl = Workload(hidden=m.hidden, tokens_per_rank=a.tokens, topk=m.topk, experts_per_rank=m.num_experts)
    gemm = resolve_gemm("auto", ctx.device, m.hidden, m.intermediate)
    impl = resolve_permute("auto", ctx.device)
    with shape_backend(ctx, wl, m.intermediate) as (backend, settings):
        inputs = make_layer_inputs(backend, wl, settings, gemm, ctx)
        layer, weights = inputs.layer, inputs.weights
        d = backend.dispatch(inputs.x, inputs.topk_idx, inputs.topk_weights)
        recv_x = d.recv_x.detach().clone()
        grad_rows = output_grad(1, 0, recv_x.shape[0], recv_x.shape[1], ctx.device)

        def step() -> None:
            weights.zero_grad()
            rx = recv_x.detach().requires_grad_(True)
            grouped = group_by_expert(rx, d.recv_topk_idx, d.recv_topk_weights, layer.experts_per_rank, impl)
            unpermute(layer.ffn(grouped), grouped.map, impl).backward(grad_rows)

        for _ in range(3):
            step()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(a.iters):
                step()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
    events = [
        e
        for e in prof.key_averages()
        if e.device_type == torch.autograd.DeviceType.CUDA or ctx.device.type != "cuda"
    ]
    key = "self_device_time_total" if ctx.device.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1.0
    print(
        f"{m.name} at EP=1, {a.tokens} tokens, gemm {gemm}, permute {impl}: expert compute fwd+bwd, {a.iters} steps"
    )
    print(f"{'µs/step':>10} {'share':>6} {'calls':>6}  kernel")
    gemm_us = 0.0
    for e in sorted(events, key=lambda e: -getattr(e, key))[: a.top]:
        us = getattr(e, key) / a.iters
        if any(s in e.key.lower() for s in ("gemm", "cutlass", "sm90", "grouped_mm", "nvjet")):
            gemm_us += us
        print(f"{us:>10.1f} {getattr(e, key) / total:>6.1%} {e.count // a.iters:>6}  {e.key[:110]}")
    print(f"total {total / a.iters:.1f} µs/step; GEMM-like kernels among those listed {gemm_us:.1f} µs")


if __name__ == "__main__":
    main()
