"""Raw all_to_all_single of exactly the bytes nccl-a2a's dispatch moves, timed like moelab times dispatch.

The yardstick for "how much does moelab's dispatch add on top of the collective": the same per-rank
split sizes (rows per destination rank from the same routing) × hidden × bf16, CUDA events, a barrier
and an L2 flush before each iteration, the slowest rank's time per iteration, the median.

    torchrun --nproc-per-node 2 benchmarks/raw_a2a.py --experts-per-rank 8 --json out.json

`--op symm` times torch.ops.symm_mem.all_to_all_vdev (NVSHMEM, split sizes on the GPU) on the same bytes
instead: the bare op under torch-symm-a2a.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from moelab.core.bandwidth import count_rows
from moelab.core.routing import route_all
from moelab.core.workload import Workload
from moelab.measure.timing import Clock


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--tokens-per-rank", type=int, default=4096)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", default=None)
    p.add_argument(
        "--op", choices=("nccl", "symm"), default="nccl", help="all_to_all_single or all_to_all_vdev"
    )
    a = p.parse_args()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    wl = Workload(
        hidden=a.hidden, tokens_per_rank=a.tokens_per_rank, topk=a.topk, experts_per_rank=a.experts_per_rank
    )
    routings = route_all(wl, world)
    per_src_dst = []
    for r in routings:
        dest = r.topk_idx // wl.experts_per_rank
        mask = torch.zeros(dest.shape[0], world, dtype=torch.bool).scatter_(1, dest, True)
        per_src_dst.append(mask.sum(0).tolist())
    send = per_src_dst[rank]
    recv = [per_src_dst[s][rank] for s in range(world)]
    clock = Clock(device, dist.group.WORLD, flush_l2=cuda)
    if a.op == "symm":
        samples = clock.sample(
            _symm_op(send, wl.tokens_per_rank * world, wl.hidden, device), a.iters, a.warmup
        )
    else:
        x = torch.randn(sum(send), wl.hidden, device=device).to(torch.bfloat16)
        y = torch.empty(sum(recv), wl.hidden, device=device, dtype=torch.bfloat16)
        samples = clock.sample(lambda: dist.all_to_all_single(y, x, recv, send), a.iters, a.warmup)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, samples)
    if rank == 0:
        per_iter = [max(s[i] for s in gathered) for i in range(a.iters)]  # type: ignore[index]
        med = statistics.median(per_iter)
        rows = count_rows(routings, wl.experts_per_rank, world)
        recv_bytes = sum(r.recv_rows for r in rows) / world * wl.hidden * 2
        out = {
            "median_us": med,
            "recv_rows_mean": recv_bytes / (wl.hidden * 2),
            "nvl_gbps": recv_bytes / med / 1e3,
            "send_rows": per_src_dst,
            "hidden": wl.hidden,
            "world": world,
            "op": a.op,
        }
        print(json.dumps(out))
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=2)
    dist.destroy_process_group()


def _symm_op(send: list[int], capacity: int, hidden: int, device: torch.device) -> Callable[[], None]:
    """all_to_all_vdev of `send` rows per destination, buffers sized for the worst case as torch-symm-a2a's."""
    import torch.distributed._symmetric_memory as symm_mem

    from moelab.backends.symm_layout import buffer_rows

    symm_mem.set_backend("NVSHMEM")
    group_name = dist.group.WORLD.group_name

    def symm(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        t = symm_mem.empty(*shape, dtype=dtype, device=device)
        symm_mem.rendezvous(t, group_name)
        return t

    rows = buffer_rows(capacity, hidden)  # >= 4 MiB: torch's block split stays exact (see symm_layout)
    x = symm(rows, hidden, dtype=torch.bfloat16)
    x.normal_()
    y = symm(rows, hidden, dtype=torch.bfloat16)
    splits = symm(len(send), dtype=torch.int64)
    splits.copy_(torch.tensor(send))
    out_splits_offsets = symm(2, len(send), dtype=torch.int64)
    return lambda: torch.ops.symm_mem.all_to_all_vdev(x, y, splits, out_splits_offsets, group_name)


if __name__ == "__main__":
    main()
