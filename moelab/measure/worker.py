"""One rank of one backend job: `python -m moelab.measure.worker RUN_DIR BACKEND`, started by a launcher.

For each case: routing → dispatch/combine correctness against the reference → timed dispatch, combine and
back-to-back pairs → samples gathered on rank 0 → one JSON line in RUN_DIR/BACKEND/results.jsonl,
flushed at once so a later crash loses nothing measured. The rank's own stdout/stderr go to
RUN_DIR/BACKEND/rank<R>.log, with faulthandler on, so a segfault leaves a Python traceback there.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import sys
import traceback
from collections import Counter
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from moelab.accounting.bandwidth import count_rows
from moelab.backends import registry
from moelab.backends.base import Backend, BackendContext, CaseConfig
from moelab.launch.diagnosis import install_stack_dumps, record_worker_error
from moelab.launch.rundir import JobFiles
from moelab.measure import checks, environment, ib_counters
from moelab.measure.reference import make_tokens, reference_dispatch
from moelab.measure.timing import Clock
from moelab.plan.routing import route_all
from moelab.plan.spec import CaseSpec, RunSpec
from moelab.tracing.nvtx_ranges import cuda_profiler_range, nvtx_range, range_name


def dist_env(spec: RunSpec) -> tuple[int, int, int]:
    """(rank, world, local rank) from the launcher's process contract. torchrun sets RANK and friends;
    under srun and mpirun they are derived from SLURM_* / OMPI_* / PMIX_* variables."""
    from moelab.launch.commands import dist_env_from_mpi, dist_env_from_slurm

    if "RANK" not in os.environ:
        if spec.launch.launcher == "slurm" or "SLURM_PROCID" in os.environ:
            os.environ.update(dist_env_from_slurm(os.environ))
        else:
            os.environ.update(
                dist_env_from_mpi(
                    os.environ, world_size=spec.launch.world, local_world_size=spec.launch.nproc_per_node
                )
            )
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))


def _redirect_output(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _case_config(case: CaseSpec) -> CaseConfig:
    """The backend's view of a case: e2e knobs (bench, mode, chunks, ...) are the harness's, not the backend's."""
    from moelab.e2e import backend_case_config

    return backend_case_config(case)


def _agree(ok: bool, group: Any) -> bool:
    flags: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(flags, ok, group=group)
    return all(flags)


def run_case(
    backend: Backend,
    case: CaseSpec,
    ctx: BackendContext,
    spec: RunSpec,
    clock: Clock,
    files: JobFiles | None = None,
) -> dict[str, Any]:
    """One case on this rank; returns the record (the same on every rank)."""
    from moelab.e2e import is_e2e, run_e2e_case

    if is_e2e(case.knobs) and not case.skip_reason:
        return run_e2e_case(backend, case, ctx, spec, clock)
    cfg = _case_config(case)
    record: dict[str, Any] = {
        "case_id": case.case_id,
        "backend": case.backend,
        "case": case.to_dict(),
        "world": ctx.world,
        "gpus_per_node": ctx.gpus_per_node,
    }
    if case.skip_reason:
        return record | {"status": "skipped", "reason": case.skip_reason}
    reason = backend.unsupported_reason(cfg)
    if reason:
        return record | {"status": "unsupported", "reason": reason}
    wl = case.workload
    backend.prepare(cfg)
    record["backend_record"] = backend.record(cfg)
    routings = route_all(wl, ctx.world)
    routing = routings[ctx.rank].to(ctx.device)
    x = make_tokens(wl, ctx.rank).to(ctx.device)

    name = backend.name
    counts: Counter[str] = Counter()
    # correctness first; a case that fails is not timed
    with nvtx_range(range_name(name, "check", case.case_id), counts):
        d = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
    expected = reference_dispatch(routings, ctx.rank, wl.experts_per_rank)
    dcheck = checks.check_dispatch(d, expected, wl, ctx.world)
    messages = [] if dcheck.ok else [f"rank {ctx.rank} dispatch: {dcheck.message}"]
    combine_err = float("nan")
    expert_out: torch.Tensor | None = None
    if dcheck.ok and dcheck.ref_rows is not None:
        expert_out = checks.expert_out_for(d, dcheck.ref_rows, ctx.rank, wl.experts_per_rank).to(ctx.device)
        with nvtx_range(range_name(name, "check", case.case_id), counts):
            out = backend.combine(expert_out, d.handle)
        cok, combine_err, cmsg = checks.check_combine(out, x, routings[ctx.rank], backend.combine_dtype(cfg))
        if not cok:
            messages.append(f"rank {ctx.rank} combine: {cmsg}")
    else:
        # keep the collective sequence aligned with the ranks whose dispatch passed
        out = backend.combine(
            torch.zeros(d.num_rows, wl.hidden, dtype=torch.bfloat16, device=ctx.device), d.handle
        )
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(
        gathered,
        {"dispatch_err": dcheck.error, "combine_err": combine_err, "messages": messages},
        group=ctx.group,
    )
    record["check"] = {
        "dispatch_err": max(g["dispatch_err"] for g in gathered),
        "combine_err": max(g["combine_err"] for g in gathered),
        "messages": [m for g in gathered for m in g["messages"]],
    }
    if record["check"]["messages"]:
        return record | {"status": "incorrect", "reason": "; ".join(record["check"]["messages"])[:2000]}
    assert expert_out is not None
    handle = d.handle
    t = spec.timing

    def do_dispatch() -> object:
        return backend.dispatch(x, routing.topk_idx, routing.topk_weights)

    def do_combine() -> object:
        return backend.combine(expert_out, handle)

    def do_pair() -> object:
        dd = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
        return backend.combine(expert_out, dd.handle)

    def ranged(op: str, fn: Any) -> Any:
        rname = range_name(name, op, case.case_id)

        def call() -> object:
            with nvtx_range(rname, counts):
                return fn()

        return call

    def warm(op: str, fn: Any, n: int) -> None:
        with nvtx_range(range_name(name, "warmup", case.case_id), counts):
            for _ in range(n):
                fn()

    ib_before = ib_counters.sample() if ctx.local_rank == 0 else None
    warm("dispatch", do_dispatch, t.warmup)
    local: dict[str, Any] = {"dispatch": clock.sample(ranged("dispatch", do_dispatch), t.iters, 0)}
    warm("combine", do_combine, t.warmup)
    local["combine"] = clock.sample(ranged("combine", do_combine), t.iters, 0)
    local["pair"] = clock.sample(ranged("pair", do_pair), t.pair_reps, 1, repeat=t.pair_iters)
    ib_after = ib_counters.sample() if ctx.local_rank == 0 else None
    ib_delta = ib_counters.delta(ib_before, ib_after)  # None when either side has no IB devices
    ib = ib_delta.to_dict() if ib_delta is not None else None
    traced: dict[str, Any] = {}
    if spec.trace.mode == "torch" and files is not None:
        traced = _torch_trace(name, case.case_id, spec, ctx, files, do_dispatch, do_combine, do_pair)
    all_samples: list[Any] = [None] * ctx.world
    dist.all_gather_object(
        all_samples,
        {"t": local, "traced": traced, "ib": ib, "host": environment.fingerprint_host(), "node": ctx.node},
        group=ctx.group,
    )
    record["nvtx_counts"] = dict(counts)
    record["ib"] = [
        {"node": s["node"], "host": s["host"], "delta": s["ib"]} for s in all_samples if s["ib"] is not None
    ] or None
    record["traces"] = [s["traced"]["trace"] for s in all_samples if s["traced"].get("trace")]
    rows = count_rows(routings, wl.experts_per_rank, ctx.gpus_per_node)
    bpt_d, bpt_c = backend.bytes_per_token(cfg, "dispatch"), backend.bytes_per_token(cfg, "combine")
    record["ops"] = {
        op: {
            "samples_us": [s["t"][op] for s in all_samples],
            "bytes_per_row": {"dispatch": bpt_d, "combine": bpt_c, "pair": bpt_d + bpt_c}[op],
            "kernel": [s["traced"].get("ops", {}).get(op) for s in all_samples] if traced else None,
        }
        for op in ("dispatch", "combine", "pair")
    }
    record["rows"] = [dataclasses.asdict(r) for r in rows]
    record["host_sync"] = backend.host_sync_note()
    return record | {"status": "ok", "reason": None}


def _torch_trace(
    name: str, case_id: str, spec: RunSpec, ctx: BackendContext, files: JobFiles, *fns: Any
) -> dict[str, Any]:
    """A few more iterations of each op under torch.profiler; per-rank Chrome trace and kernel-only times."""
    from moelab.tracing.kernel_time import op_kernel_times
    from moelab.tracing.torch_trace import TracedOp, capture_torch_trace, summarize_chrome_trace, trace_path

    ops = [TracedOp(op=op, fn=fn) for op, fn in zip(("dispatch", "combine", "pair"), fns, strict=True)]
    path = trace_path(files.dir, case_id, ctx.rank)
    cap = capture_torch_trace(
        ops,
        backend=name,
        case_id=case_id,
        iters=spec.trace.iters,
        path=path,
        rank=ctx.rank,
        world_size=ctx.world,
        device=ctx.device,
        group=ctx.group,
    )
    kt = op_kernel_times(summarize_chrome_trace(cap.path), name, case_id, cap.calls)
    rel = str(cap.path.relative_to(files.run_dir))
    return {
        "trace": {"rank": ctx.rank, "kind": "torch", "path": rel, "size_bytes": cap.size_bytes},
        "ops": {op: k.to_record() for op, k in kt.items()},
    }


def main(argv: list[str]) -> int:
    run_dir, backend_name = Path(argv[0]), argv[1]
    spec = RunSpec.read(run_dir / "spec.json")
    rank, world, local_rank = dist_env(spec)
    files = JobFiles(run_dir, backend_name)
    _redirect_output(files.rank_log(rank))
    install_stack_dumps(files.dir, rank)  # faulthandler on SIGUSR1 (the launcher's timeout) and SIGTERM
    print(f"moelab worker rank {rank}/{world} backend {backend_name} pid {os.getpid()}", flush=True)
    binding = None
    if spec.launch.bind == "numa":
        from moelab.health.numa_bind import apply_binding, cuda_uuid, resolve_binding

        uuid = cuda_uuid(local_rank) if spec.launch.device == "cuda" else None
        binding = apply_binding(resolve_binding(local_rank, uuid=uuid)).to_dict()
        print(f"bound to NUMA: {binding}", flush=True)
    if spec.launch.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        comm = "nccl"
        dist.init_process_group(
            comm, timeout=timedelta(seconds=spec.launch.collective_timeout_s), device_id=device
        )
    else:
        device = torch.device("cpu")
        comm = "gloo"
        dist.init_process_group(comm, timeout=timedelta(seconds=spec.launch.collective_timeout_s))
    group = dist.group.WORLD
    ctx = BackendContext(
        rank=rank,
        world=world,
        local_rank=local_rank,
        device=device,
        group=group,
        gpus_per_node=spec.launch.gpus_per_node,
        comm_backend=comm,
    )
    cases = spec.cases_for(backend_name)
    cls = registry.load(backend_name)
    backend = cls(ctx, [_case_config(c) for c in cases if not c.skip_reason])
    env = environment.fingerprint(device) | {
        "rank": rank,
        "local_rank": local_rank,
        "node": ctx.node,
        "library_versions": backend.library_versions(),
        "binding": binding,
    }
    envs: list[Any] = [None] * world
    dist.all_gather_object(envs, env, group=group)
    writer = local_rank == 0  # every node keeps the whole run directory; the launching host ingests it
    if writer:
        files.write_env(envs)
    clock = Clock(device, group, spec.timing.flush_l2)
    profiled = spec.trace.mode == "nsys" or spec.trace.wrap is not None
    with cuda_profiler_range() if profiled else nullcontext():
        for case in cases:
            record = run_case(backend, case, ctx, spec, clock, files)
            if writer:
                files.append_result(record)
            print(f"case {case.case_id}: {record['status']}", flush=True)
    backend.close()
    dist.barrier(group=group)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exc()
        record_worker_error(sys.argv[1:], exc)  # RUN_DIR/BACKEND/rank<R>.error.json
        sys.stderr.flush()
        os._exit(1)  # skip interpreter teardown: a wedged process group must not hang the exit
