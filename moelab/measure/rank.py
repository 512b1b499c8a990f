"""One rank of one backend job (moelab.measure.worker is its entry point, started by a launcher).

For each case, its kind's runner (moelab.measure.kinds: a dispatch/combine case or an e2e layer): routing →
correctness against the reference → each op timed until stable → a CaseRecord (moelab.core.case_record)
→ one JSON line in RUN_DIR/BACKEND/results.jsonl,
flushed at once so a later crash loses nothing measured. The rank's own stdout/stderr go to
RUN_DIR/BACKEND/rank<R>.log, with faulthandler on, so a segfault leaves a Python traceback there.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends import registry
from moelab.backends.base import BackendContext, CaseConfig
from moelab.core.spec import RunSpec
from moelab.job.diagnosis import install_stack_dumps
from moelab.job.events import ProgressEvents
from moelab.job.heartbeat import start_heartbeat
from moelab.job.rundir import JobFiles, RunDir
from moelab.measure import environment
from moelab.measure.case_context import CaseContext
from moelab.measure.kinds import run_case
from moelab.measure.teardown import release_process_groups, teardown_line
from moelab.measure.timing import Clock
from moelab.tracing.nvtx_ranges import cuda_profiler_range


def dist_env(spec: RunSpec) -> tuple[int, int, int]:
    """(rank, world, local rank) from the launcher's process contract. torchrun sets RANK and friends;
    under srun and mpirun they are derived from SLURM_* / OMPI_* / PMIX_* variables."""
    from moelab.job.launchers import dist_env_from_mpi, dist_env_from_slurm

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
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _measure_peaks_once(run_dir: Path, ctx: BackendContext, spec: RunSpec) -> None:
    """The run's first ranks job measures the machine's link figures (RUN_DIR/peaks.json: pair by pair and
    with every peer at once) and, on GPUs, their matmul and copy rates (RUN_DIR/rates.json); later jobs see
    the file and skip. Rank 0 decides, so every rank runs the same collectives."""
    from moelab.core.peaks import write_peaks, write_rates
    from moelab.measure.peaks import CPU_PEAK_BYTES, PEAK_BYTES, measure_device_rates, measure_peaks

    rd = RunDir(run_dir)
    decision: list[Any] = [not rd.peaks_file.exists()] if ctx.rank == 0 else [None]
    dist.broadcast_object_list(decision, src=0, group=ctx.group)
    if not decision[0]:
        return
    clock = Clock(ctx.device, ctx.group, spec.timing.flush_l2)
    cuda = ctx.device.type == "cuda"
    peaks = measure_peaks(clock, ctx.rank, ctx.world, PEAK_BYTES if cuda else CPU_PEAK_BYTES)
    rates = measure_device_rates(clock) if cuda else []  # a GPU's rates: the e2e layer's roofline
    if ctx.local_rank == 0:
        if rates:
            write_rates(rd.rates_file, rates)  # first: peaks.json says the measurement is done
        write_peaks(rd.peaks_file, peaks)
    print("measured peaks: " + ", ".join(f"{p.name} {p.gbps:.1f} GB/s" for p in peaks), flush=True)
    if rates:
        print("measured rates: " + ", ".join(f"{r.name} {r.value:.1f} {r.unit}" for r in rates), flush=True)


def main(argv: list[str]) -> int:
    files = JobFiles.of_worker(argv)
    run_dir, backend_name = files.run_dir, files.backend
    spec = RunDir(run_dir).spec
    rank, world, local_rank = dist_env(spec)
    files.ensure_dir()  # never the run directory itself: one moved away mid-run is not re-created
    events = ProgressEvents.for_job(files.dir, enabled=local_rank == 0)
    _redirect_output(files.rank_log(rank))
    install_stack_dumps(files.dir, rank)  # faulthandler on SIGUSR1 (the launcher's timeout) and SIGTERM
    start_heartbeat(files.heartbeat_file(rank))  # which rank stopped first, when the job fails
    print(f"moelab worker rank {rank}/{world} backend {backend_name} pid {os.getpid()}", flush=True)
    binding = None
    if spec.launch.bind == "numa":
        from moelab.job.numa import apply_binding, cuda_uuid, resolve_binding

        uuid = cuda_uuid(local_rank) if spec.launch.device == "cuda" else None
        binding = apply_binding(resolve_binding(local_rank, uuid=uuid)).to_dict()
        print(f"bound to NUMA: {binding}", flush=True)
    with events.timed_setup("communicator"):
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
    _run_cases(files, spec, events, rank, world, local_rank, device, comm, binding)
    print(teardown_line(release_process_groups()), flush=True)  # the groups' threads end here, not at exit
    return 0


def _run_cases(
    files: JobFiles,
    spec: RunSpec,
    events: ProgressEvents,
    rank: int,
    world: int,
    local_rank: int,
    device: torch.device,
    comm: str,
    binding: dict[str, Any] | None,
) -> None:
    """Every case of the job, on the process groups main set up. Everything that holds a group (the
    context, the backend, the clock) lives in this frame only, so that it is gone when this returns and
    main can destroy the groups (moelab.measure.teardown)."""
    run_dir, backend_name = files.run_dir, files.backend
    group = dist.group.WORLD
    ctx = BackendContext(
        rank=rank,
        world=world,
        local_rank=local_rank,
        device=device,
        group=group,
        gpus_per_node=spec.launch.gpus_per_node,
        comm_backend=comm,
        kernel_cache=Path(spec.launch.kernel_cache) if spec.launch.kernel_cache else None,
    )
    if spec.timing.peaks and (
        spec.launch.device == "cuda" or world > 1
    ):  # CPU runs too: gloo, smaller buffers
        _measure_peaks_once(run_dir, ctx, spec)
    cases = spec.cases_for(backend_name)
    cls = registry.load_backend(backend_name)
    with events.timed_setup("buffers"):
        backend = cls(ctx, [CaseConfig.of(c) for c in cases if not c.skip_reason])
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
    cc = CaseContext(backend=backend, ctx=ctx, spec=spec, clock=clock, files=files, events=events)
    with cuda_profiler_range() if profiled else nullcontext():
        for case in cases:
            events.case_start(case.case_id)
            record = run_case(cc, case)
            if writer:
                files.append_result(record)
            events.case_end(case.case_id, record.status)
            print(f"case {case.case_id}: {record.status}", flush=True)
    backend.close()
    dist.barrier(group=group)
