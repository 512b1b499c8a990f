"""DeepEP, DeepEP low-latency and Hybrid-EP against moelab's reference on 2 GPUs (NCCL), correctness only;
the timing comparison is `moelab verify` (moelab beside the libraries' own tests).

    python -m pytest -q -m gpu tests/gpu/test_deepep_gpu.py
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Any

import pytest
import torch

from moelab.backends import registry

pytestmark = pytest.mark.gpu

CASES: dict[str, list[tuple[dict[str, Any], dict[str, Any], int | None]]] = {
    # (workload fields, knobs, sms)
    "deepep": [
        ({"hidden": 7168, "dtype": "bf16"}, {}, 24),
        ({"hidden": 7168, "dtype": "bf16"}, {}, 24),
        ({"hidden": 7168, "dtype": "fp8"}, {}, None),
        ({"hidden": 8192, "dtype": "fp8"}, {}, 16),
        ({"hidden": 8192, "dtype": "bf16"}, {}, 24),  # must come back unsupported, not trap
    ],
    "hybrid-ep": [
        ({"hidden": 8192, "dtype": "bf16"}, {}, None),
        ({"hidden": 8192, "dtype": "bf16"}, {}, 16),
        ({"hidden": 8192, "dtype": "fp8"}, {}, None),
        ({"hidden": 8192, "dtype": "bf16"}, {"fused": True, "pad_multiple": 32}, None),
        ({"hidden": 8192, "dtype": "bf16"}, {"permute": True}, None),
    ],
    "deepep-ll": [
        ({"hidden": 7168, "dtype": "bf16", "tokens_per_rank": 128}, {}, None),
        ({"hidden": 7168, "dtype": "fp8", "tokens_per_rank": 128}, {}, None),
    ],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, name: str, results: Any) -> None:
    import torch.distributed as dist

    from moelab.backends.base import BackendContext, CaseConfig
    from moelab.core.routing import route_all
    from moelab.core.workload import Workload
    from moelab.measure import checks
    from moelab.measure.reference import make_tokens, reference_dispatch

    try:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
        )
        ctx = BackendContext(
            rank=rank,
            world=world,
            local_rank=rank,
            device=device,
            group=dist.group.WORLD,
            gpus_per_node=world,
            comm_backend="nccl",
        )
        cfgs = []
        for i, (fields, knobs, sms) in enumerate(CASES[name]):
            wl = Workload(**({"tokens_per_rank": 1024, "experts_per_rank": 8, "topk": 8} | fields))
            cfgs.append(CaseConfig(case_id=f"c{i}", workload=wl, sms=sms, knobs=knobs))
        backend = registry.load(name)(ctx, cfgs)
        out = []
        for cfg in cfgs:
            reason = backend.unsupported_reason(cfg)
            if reason:
                out.append(("unsupported", cfg.case_id, reason))
                continue
            backend.prepare(cfg)
            wl = cfg.workload
            routings = route_all(wl, world)
            routing = routings[rank].to(device)
            x = make_tokens(wl, rank).to(device)
            for _ in range(3):  # repeats exercise the caches (cached handles, casts, adapters)
                d = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
                dcheck = checks.check_dispatch(
                    d, reference_dispatch(routings, rank, wl.experts_per_rank), wl, world
                )
                assert dcheck.ok and dcheck.ref_rows is not None, (
                    f"{cfg.case_id} {cfg.knobs}: {dcheck.message}"
                )
                expert_out = checks.expert_out_for(d, dcheck.ref_rows, rank, wl.experts_per_rank).to(device)
                combined = backend.combine(expert_out, d.handle)
                ok, err, msg = checks.check_combine(combined, x, routings[rank], backend.combine_dtype(cfg))
                assert ok, f"{cfg.case_id} {cfg.knobs}: {msg}"
            torch.cuda.synchronize()
            out.append(("ok", cfg.case_id, backend.record(cfg)))
        out.append(("versions", "", backend.library_versions()))
        backend.close()
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, out, None))
    except BaseException:
        results.put((rank, None, traceback.format_exc()))


@pytest.mark.parametrize("name", list(CASES))
def test_backend_matches_reference(name: str) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    reason = registry.availability(name)
    if reason:
        pytest.skip(f"{name}: {reason}")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, name, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [err for _, _, err in got if err]
    assert not errors, "\n".join(errors)
    for rank, out, _ in sorted(got, key=lambda g: g[0]):
        print(f"rank {rank}: {out}")
    rank0 = next(out for rank, out, _ in got if rank == 0)
    outcome = {case: status for status, case, _ in rank0 if status != "versions"}
    if name == "deepep":
        assert outcome["c4"] == "unsupported"
        assert all(outcome[c] == "ok" for c in ("c0", "c1", "c2", "c3"))
    else:
        assert all(v == "ok" for v in outcome.values())
