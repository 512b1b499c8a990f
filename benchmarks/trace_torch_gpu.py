"""GPU check of moelab.tracing on real kernels: nccl-a2a dispatch/combine of the reference workload under
torch.profiler (CUDA activities), one Chrome trace per rank, then the kernel-only vs API summary.

Checks, per rank: the trace has distributedInfo.rank; every op range has NCCL kernels attributed by
correlation id; kernel-only time per call is positive and not above the range's API time. Also records
what `nsys_available()` says on this host, and runs the NVTX ranges once (with the `nvtx` package when
installed, else torch.cuda.nvtx). Exits 1 when a check fails. Writes OUT/traces/<case>/rank<R>.json
and OUT/trace_summary_rank<R>.json.

    torchrun --standalone --nproc-per-node=2 benchmarks/trace_torch_gpu.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from moelab.backends.base import BackendContext, CaseConfig  # noqa: E402
from moelab.backends.nccl_a2a import NcclA2ABackend  # noqa: E402
from moelab.core.routing import route_all  # noqa: E402
from moelab.core.workload import Workload  # noqa: E402
from moelab.job.rundir import JobFiles  # noqa: E402
from moelab.measure.reference import make_tokens  # noqa: E402
from moelab.tracing.kernel_time import kernel_bandwidth_gbs, op_kernel_times  # noqa: E402
from moelab.tracing.nsys import nsys_available  # noqa: E402
from moelab.tracing.nvtx_ranges import cuda_profiler_range, nvtx_impl, nvtx_range, range_name  # noqa: E402
from moelab.tracing.torch_trace import TracedOp, capture_torch_trace, summarize_chrome_trace  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=8192)
    args = ap.parse_args()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", timeout=timedelta(seconds=300), device_id=device)
    wl = Workload(hidden=args.hidden, tokens_per_rank=args.tokens, topk=8, experts_per_rank=8)
    case_id = "ref-" + wl.label()
    ctx = BackendContext(
        rank=rank,
        world=world,
        local_rank=local,
        device=device,
        group=dist.group.WORLD,
        gpus_per_node=world,
        comm_backend="nccl",
    )
    case = CaseConfig(case_id=case_id, workload=wl)
    backend = NcclA2ABackend(ctx, [case])
    backend.prepare(case)
    routing = route_all(wl, world)[rank].to(device)
    x = make_tokens(wl, rank).to(device)
    d = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
    expert_out = torch.zeros(d.num_rows, wl.hidden, dtype=torch.bfloat16, device=device)
    counts: Counter[str] = Counter()
    with nvtx_range(range_name("nccl-a2a", "warmup", case_id), counts), cuda_profiler_range():
        for _ in range(3):
            backend.combine(expert_out, backend.dispatch(x, routing.topk_idx, routing.topk_weights).handle)
    ops = [
        TracedOp(op="dispatch", fn=lambda: backend.dispatch(x, routing.topk_idx, routing.topk_weights)),
        TracedOp(op="combine", fn=lambda: backend.combine(expert_out, d.handle)),
    ]
    cap = capture_torch_trace(
        ops, backend="nccl-a2a", case_id=case_id, iters=args.iters, path=JobFiles.of_dir(args.out).torch_trace(case_id, rank),
        rank=rank, world_size=world, device=device, group=dist.group.WORLD,
    )  # fmt: skip
    summary = summarize_chrome_trace(cap.path)
    times = op_kernel_times(summary, "nccl-a2a", case_id, cap.calls)
    nvl_bytes = d.num_rows * wl.hidden * 2
    failures = []
    data = json.loads(cap.path.read_text())
    if data.get("distributedInfo", {}).get("rank") != rank:
        failures.append(f"distributedInfo.rank is {data.get('distributedInfo')}")
    report: dict[str, Any] = {
        "rank": rank,
        "nvtx_impl": nvtx_impl(),
        "nsys": nsys_available(),
        "trace": str(cap.path),
        "size_bytes": cap.size_bytes,
        "ops": {},
    }
    for op in ("dispatch", "combine"):
        t = times.get(op)
        if t is None or t.kernel_us is None or t.kernel_us <= 0:
            failures.append(f"{op}: no kernels attributed")
            continue
        if t.kernel_us > t.api_us * 1.01:
            failures.append(f"{op}: kernel-only {t.kernel_us:.1f} us above API {t.api_us:.1f} us")
        if not any("nccl" in k.name.lower() for k in t.kernels):
            failures.append(f"{op}: no NCCL kernel among {[k.name for k in t.kernels]}")
        report["ops"][op] = t.to_record() | {
            "api_gbs": kernel_bandwidth_gbs(nvl_bytes, t.api_us),
            "kernel_gbs": kernel_bandwidth_gbs(nvl_bytes, t.kernel_us),
        }
        print(f"rank {rank} {op}: api {t.api_us:.1f} us, kernel-only {t.kernel_us:.1f} us; top kernels "
              + ", ".join(f"{k.name} {100 * k.share:.0f}%" for k in t.kernels[:3]), flush=True)  # fmt: skip
    report["failures"] = failures
    (args.out / f"trace_summary_rank{rank}.json").write_text(json.dumps(report, indent=2, default=str))
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        print(f"rank {rank} FAILED: {failures}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
