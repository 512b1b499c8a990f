"""The e2e MoE-layer cases of moelab.measure.e2e straight under torchrun, without the worker or the store: checks the
layer against the float32 reference on GPU, times it, prints one line per case and writes the records.

    torchrun --nproc-per-node 2 benchmarks/e2e_gpu.py --backends nccl-a2a,mxfp8-a2a --experts-per-rank 8 \
        --modes serial,tbo --sms default,24 --backward --json-dir OUT

Each backend gets its own process group configuration as in a moelab job (one backend after another in
one job here: a backend that crashes takes the rest of this script with it).
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends import registry
from moelab.backends.base import BackendContext, CaseConfig
from moelab.core.case_record import CaseRecord
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec, TimingSpec
from moelab.core.workload import Workload
from moelab.measure.case_context import CaseContext
from moelab.measure.e2e.bench import run_e2e_case
from moelab.measure.timing import Clock
from moelab.suites.loader import case_id_for


def _cases(a: argparse.Namespace, backend: str, world: int) -> list[CaseSpec]:
    dtype = {"mxfp8-a2a": "mxfp8", "deepep": "fp8"}.get(backend, "bf16") if a.dtype == "auto" else a.dtype
    wl = Workload(
        hidden=a.hidden,
        tokens_per_rank=a.tokens_per_rank,
        topk=a.topk,
        experts_per_rank=a.experts_per_rank,
        dtype=dtype,
    )
    wl.validate(world)
    cases = []
    for mode in a.modes.split(","):
        for sms_text in a.sms.split(","):
            sms = None if sms_text == "default" else int(sms_text)
            knobs: dict[str, Any] = {"bench": "e2e", "mode": mode, "gemm": a.gemm}
            if mode == "chunked":
                knobs["chunks"] = a.chunks
            if a.backward:
                knobs["backward"] = True
            case_id = case_id_for(wl, sms, knobs)
            cases.append(
                CaseSpec.from_asked(knobs=knobs, case_id=case_id, backend=backend, workload=wl, sms=sms)
            )
    return cases


def _line(record: CaseRecord) -> str:
    rec = record.to_dict()
    e2e = rec.get("backend_record", {}).get("e2e", {})
    head = f"{rec['case']['backend']:<10} {rec['case']['knobs'].get('mode'):<8} sms={rec['case']['sms']!s:<7} {rec['status']:<11}"
    if rec["status"] != "ok":
        return f"{head} {rec.get('reason')}"
    m = {d["name"]: d["value"] for d in rec["metrics"]}
    parts = [
        f"gemm={e2e.get('gemm')}",
        f"err={m['layer_rel_err']:.2e}",
        f"layer={m['layer_us']:.0f}us",
        f"tok/s={m['tokens_per_s_per_rank']:.3g}",
        f"exposed={m['exposed_comm_us']:.0f}us",
        f"gemm={m['gemm_tflops_per_rank']:.0f}TF/s",
    ]
    if m.get("overlap_efficiency") is not None:
        parts.append(f"overlap_eff={m['overlap_efficiency']:.2f}")
    if m.get("speedup_vs_serial") is not None:
        parts.append(f"vs_serial={m['speedup_vs_serial']:.3f}x")
    if m.get("gemm_slowdown") is not None:
        parts.append(f"gemm_slowdown={m['gemm_slowdown']:+.1%}")
    if "tokens_per_s_per_rank_fwd_bwd" in m:
        parts.append(
            f"fwd_bwd_tok/s={m['tokens_per_s_per_rank_fwd_bwd']:.3g} gx_err={m['grad_x_rel_err']:.2e} gw_err={m['grad_w_rel_err']:.2e}"
        )
    return f"{head} " + " ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="nccl-a2a")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--tokens-per-rank", type=int, default=4096)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts-per-rank", type=int, default=8)
    p.add_argument("--dtype", default="auto", help="auto: mxfp8 for mxfp8-a2a, fp8 for deepep, else bf16")
    p.add_argument("--modes", default="serial,tbo")
    p.add_argument("--sms", default="default")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--gemm", default="auto")
    p.add_argument("--backward", action="store_true")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json-dir", default=None)
    a = p.parse_args()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()  # CPU (gloo) only to smoke-test this script
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", timeout=timedelta(seconds=300), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    comm = "nccl" if cuda else "gloo"
    ctx = BackendContext(
        rank=rank,
        world=world,
        local_rank=local,
        device=device,
        group=dist.group.WORLD,
        gpus_per_node=world,
        comm_backend=comm,
    )
    timing = TimingSpec(warmup=a.warmup, iters=a.iters, flush_l2=cuda)
    clock = Clock(device, ctx.group, timing.flush_l2)
    for name in a.backends.split(","):
        cls = registry.load_backend(name)
        why = cls.availability()
        if why:
            if rank == 0:
                print(f"{name:<10} unavailable: {why}", flush=True)
            continue
        cases = _cases(a, name, world)
        spec = RunSpec(
            run_id="e2e-gpu",
            created_at="2026-01-01T00:00:00+00:00",
            suite="e2e",
            backends=(name,),
            cases=tuple(cases),
            timing=timing,
            launch=LaunchSpec(device=device.type, nproc_per_node=world, gpus_per_node=world),
        )
        backend = cls(ctx, [CaseConfig.of(c) for c in cases])
        cc = CaseContext(backend=backend, ctx=ctx, spec=spec, clock=clock, files=None)
        for case in cases:
            rec = run_e2e_case(cc, case)
            if rank == 0:
                print(_line(rec), flush=True)
                if a.json_dir:
                    out = Path(a.json_dir)
                    out.mkdir(parents=True, exist_ok=True)
                    with (out / f"{name}.jsonl").open("a") as f:
                        f.write(rec.to_json() + "\n")
        backend.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
