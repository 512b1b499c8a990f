"""Run a function in N real gloo ranks (spawned processes, file:// rendezvous) and collect what each returns.

    results = run_ranks(4, fn, spec)   # fn(rank, world, spec) in each of 4 ranks -> picklable, by rank

`fn` must be importable by name (a module-level function of a test module): spawned children unpickle it.
A rank that raises makes run_gloo raise with that rank's traceback; a rank that hangs past `timeout` is
killed, with the others, and reported.
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moelab.backends.base import BackendContext

_WORLD: Any = object()


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    init_file: str,
    args: Sequence[Any],
    results: Any,
    timeout: float,
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
        try:
            value = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
    """fn(rank, world, *args) in `world` gloo ranks on this host; the return values, indexed by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="moelab-gloo-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_rank_main, args=(fn, rank, world, init_file, tuple(args), results, timeout))
            for rank in range(world)
        ]
        for p in procs:
            p.start()
        got: dict[int, tuple[bool, Any]] = {}
        try:
            while len(got) < world:
                try:
                    rank, ok, value = results.get(timeout=timeout)
                except queue.Empty:
                    missing = sorted(set(range(world)) - set(got))
                    raise TimeoutError(
                        f"gloo ranks {missing} of {world} did not finish within {timeout:.0f} s"
                    ) from None
                got[rank] = (ok, value)
                if not ok:
                    break
        finally:
            for p in procs:
                p.join(timeout=5 if len(got) == world else 0.1)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    failed = {r: v for r, (ok, v) in got.items() if not ok}
    if failed:
        rank = min(failed)
        raise AssertionError(f"rank {rank} of {world} failed:\n{failed[rank]}")
    return [got[r][1] for r in range(world)]


def gloo_context(rank: int, world: int, group: Any = _WORLD) -> BackendContext:
    """A backend's context in one of run_ranks' CPU ranks: one node, gloo, the world group unless given
    (None for a backend built without a process group)."""
    return BackendContext(
        rank=rank, world=world, local_rank=rank, device=torch.device("cpu"),
        group=dist.group.WORLD if group is _WORLD else group, gpus_per_node=world, comm_backend="gloo",
    )  # fmt: skip


def groups_left(run_dir: Path) -> dict[str, str]:
    """Each rank log of a `moelab run` directory whose process groups did not end before its exit
    (moelab.measure.teardown), with its teardown line; {} when every rank's did."""
    left = {}
    for log in sorted(run_dir.glob("*/rank*.log")):
        lines = [line for line in log.read_text().splitlines() if line.startswith("teardown:")]
        if not lines or "no communicator thread left" not in lines[-1]:
            left[str(log.relative_to(run_dir))] = lines[-1] if lines else "no teardown line"
    return left
