"""torch-symm-a2a and nccl-ep against moelab's reference on 2 GPUs: uneven routings, the layout/dispatch
split, and (torch-symm-a2a) a CUDA graph of dispatch + combine replayed without a host sync.

    python -m pytest -q -m gpu tests/gpu/test_symm_nccl_ep_gpu.py
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

CASES: list[tuple[dict[str, Any], int | None]] = [
    # (workload fields, sms)
    ({"hidden": 8192, "routing": "uniform"}, None),
    ({"hidden": 7168, "routing": "zipf"}, None),
    ({"hidden": 4096, "routing": "hot", "tokens_per_rank": 512}, None),
]
SM_CASE: tuple[dict[str, Any], int | None] = ({"hidden": 4096, "routing": "uniform"}, 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check(backend: Any, d: Any, x: torch.Tensor, wl: Any, routings: Any, rank: int, world: int) -> None:
    from moelab.measure import checks
    from moelab.measure.reference import reference_dispatch

    dcheck = checks.check_dispatch(d, reference_dispatch(routings, rank, wl.experts_per_rank), wl, world)
    assert dcheck.ok and dcheck.ref_rows is not None, dcheck.message
    expert_out = checks.expert_out_for(d, dcheck.ref_rows, rank, wl.experts_per_rank).to(x.device)
    combined = backend.combine(expert_out, d.handle)
    ok, _, msg = checks.check_combine(combined, x, routings[rank], "bf16")
    assert ok, msg


def _rank_main(rank: int, world: int, port: int, name: str, graph: bool, results: Any) -> None:
    import torch.distributed as dist

    from moelab.backends.base import BackendContext, CaseConfig
    from moelab.core.routing import route_all
    from moelab.core.workload import RoutingSpec, Workload
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
        cases = CASES + ([SM_CASE] if registry.load(name).sm_control else [])
        cfgs = []
        for i, (fields, sms) in enumerate(cases):
            routing = RoutingSpec(kind=fields.pop("routing", "uniform"))
            base = {"tokens_per_rank": 2048, "experts_per_rank": 8, "topk": 8}
            cfgs.append(
                CaseConfig(case_id=f"c{i}", workload=Workload(**(base | fields), routing=routing), sms=sms)
            )
        backend = registry.load(name)(ctx, cfgs)
        out = []
        for cfg in cfgs:
            backend.prepare(cfg)
            wl = cfg.workload
            routings = route_all(wl, world)
            routing = routings[rank].to(device)
            x = make_tokens(wl, rank).to(device)
            for _ in range(2):  # fresh: the backend computes the layout itself
                _check(
                    backend,
                    backend.dispatch(x, routing.topk_idx, routing.topk_weights),
                    x,
                    wl,
                    routings,
                    rank,
                    world,
                )
            lay = backend.layout(routing.topk_idx, routing.topk_weights)
            for _ in range(2):  # one layout, several dispatches
                d = backend.dispatch(x, routing.topk_idx, routing.topk_weights, layout=lay)
                _check(backend, d, x, wl, routings, rank, world)
            out.append(("ok", cfg.case_id, backend.record(cfg)))
        if graph:
            cfg = cfgs[0]
            backend.prepare(cfg)
            wl = cfg.workload
            routings = route_all(wl, world)
            routing = routings[rank].to(device)
            x = make_tokens(wl, rank).to(device)
            d0 = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
            dcheck = checks.check_dispatch(
                d0, reference_dispatch(routings, rank, wl.experts_per_rank), wl, world
            )
            assert dcheck.ok and dcheck.ref_rows is not None, dcheck.message
            expert_out = checks.expert_out_for(d0, dcheck.ref_rows, rank, wl.experts_per_rank).to(device)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up on the capture stream
                backend.combine(
                    expert_out, backend.dispatch(x, routing.topk_idx, routing.topk_weights).handle
                )
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            dist.barrier()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                dg = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
                combined = backend.combine(expert_out, dg.handle)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            ok, _, msg = checks.check_combine(combined, x, routings[rank], "bf16")
            assert ok, f"graph replay: {msg}"
            out.append(("ok", "graph", {}))
        out.append(("versions", "", backend.library_versions()))
        backend.close()
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, out, None))
    except BaseException:
        results.put((rank, None, traceback.format_exc()))


@pytest.mark.parametrize(("name", "graph"), [("torch-symm-a2a", True), ("nccl-ep", False)])
def test_backend_matches_reference(name: str, graph: bool) -> None:
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
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, name, graph, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [err for _, _, err in got if err]
    assert not errors, "\n".join(errors)
    for rank, out, _ in sorted(got, key=lambda g: g[0]):
        print(f"rank {rank}: {out}")
