"""A run from the launching host: run directory → one launched job per backend (with a health snapshot
before and after) → ingest in one transaction."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import moelab
from moelab.backends import registry
from moelab.backends.base import HostJob
from moelab.core.errors import MoelabError
from moelab.core.spec import RunSpec
from moelab.health import contention, run_registry
from moelab.job import launchers
from moelab.job.local import JobOutcome, run_job
from moelab.job.rundir import JobFiles, RunDir
from moelab.launch.interrupt import RunInterrupt, note_interrupted_job
from moelab.launch.progress import watch_job
from moelab.launch.run_dir_anchor import RunDirAnchor
from moelab.plan.case_list import planned_kind
from moelab.store.db import open_db
from moelab.store.ingest import ingest
from moelab.store.judgments import judge

EMULATED_INTERNODE_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket"}


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: str
    run_dir: Path
    jobs: dict[str, JobOutcome]
    ingested: bool
    interrupted_by: str | None = None  # SIGINT / SIGTERM when the run was stopped
    trace_notes: dict[str, str] = field(
        default_factory=dict
    )  # backend -> why its asked-for traces are missing

    @property
    def all_jobs_ok(self) -> bool:
        return all(j.ok for j in self.jobs.values())


def job_env(spec: RunSpec, backend: str) -> dict[str, str]:
    """The environment of one backend job: this process's, plus moelab on PYTHONPATH, the backend's own
    library path (--backend-path), and, in emulated inter-node mode, NCCL forced onto its network transport
    (no peer-to-peer over NVLink or PCIe, no shared memory: every pair goes through the socket transport as
    between nodes; it models the host-staged path and proxy threads, not an RDMA NIC's bandwidth)."""
    env = dict(os.environ)
    paths = [str(Path(moelab.__file__).resolve().parent.parent)]
    if backend in spec.launch.backend_paths:
        paths.insert(0, str(Path(spec.launch.backend_paths[backend]).resolve()))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if spec.launch.emulate_internode:
        env.update(EMULATED_INTERNODE_ENV)
    return env


def launch_plan(spec: RunSpec, run_dir: Path, backend: str, repeat: int = 0) -> launchers.LaunchPlan:
    files = JobFiles(run_dir, backend, repeat)
    nsys = None
    if spec.trace.mode == "nsys":
        from moelab.tracing.nsys import nsys_profile_argv

        nsys = launchers.NsysWrap(
            argv=tuple(nsys_profile_argv(osrt=spec.trace.nsys_osrt)), output=str(files.nsys_prefix)
        )
    return launchers.LaunchPlan(
        launcher=spec.launch.launcher,
        nodes=spec.launch.nodes,
        gpus_per_node=spec.launch.nproc_per_node,
        device=spec.launch.device,
        python=sys.executable,
        worker_args=files.worker_args,
        rdzv_endpoint=spec.launch.rdzv_endpoint,
        rdzv_id=spec.run_id,
        node_rank=spec.launch.node_rank,
        nsys=nsys,
        sbatch=launchers.SbatchOptions(
            container_image=spec.launch.container_image, container_mounts=spec.launch.container_mounts
        ),
    )


def job_argv(spec: RunSpec, run_dir: Path, backend: str, repeat: int = 0) -> list[str]:
    """The command this host runs for one backend job (one node's share under torchrun multi-node)."""
    plan = launch_plan(spec, run_dir, backend, repeat)
    plan.validate()
    if spec.launch.launcher == "local":
        argv = launchers.torchrun_local_argv(plan)
    elif spec.launch.launcher == "torchrun":
        argv = launchers.torchrun_multinode_argv(plan)
    elif spec.launch.launcher == "slurm":
        argv = launchers.srun_argv(plan)
    elif spec.launch.launcher == "mpirun":
        argv = launchers.mpirun_argv(plan)
    else:
        raise MoelabError(f"unknown launcher {spec.launch.launcher!r}")
    if spec.trace.wrap:
        from moelab.tracing.nsys import rank_var_for
        from moelab.tracing.wrap import splice_rank_wrapper, wrap_prefix_argv

        prefix = wrap_prefix_argv(
            spec.trace.wrap,
            JobFiles(run_dir, backend, repeat).traces_dir,
            backend,
            rank_var_for(spec.launch.launcher),
        )
        argv = splice_rank_wrapper(argv, prefix)
    return argv


def _health(spec: RunSpec, files: JobFiles, phase: str) -> object | None:
    if not spec.health.snapshots:
        return None
    from moelab.health import rules
    from moelab.health.snapshot import dumps, take_snapshot_subprocess

    snap = take_snapshot_subprocess(load_ms=spec.health.load_ms if spec.launch.device == "cuda" else 0.0)
    findings = rules.evaluate(snap)
    verdict = {"worst": rules.worst(findings), "findings": [f.to_dict() for f in findings]}
    files.write_health(phase, dumps(snap), verdict)
    return snap


def run_backend(spec: RunSpec, rd: RunDir, backend: str, quiet: bool = False, repeat: int = 0) -> JobOutcome:
    files = rd.job(backend, repeat)
    before = _health(spec, files, "before")
    if before is not None and spec.health.require_healthy:
        from moelab.health.snapshot import require_healthy

        require_healthy(before)  # type: ignore[arg-type]
    num_cases, launch = len(spec.cases_for(backend)), spec.launch
    kinds = {c.case_id: planned_kind(c, launch) for c in spec.cases_for(backend)}
    if spec.trace.mode == "nsys" or spec.trace.wrap:
        files.traces_dir.mkdir(parents=True, exist_ok=True)  # the tools write there, and make no folder
    with (
        watch_job(files.dir, num_cases, launch.world, launch.device, quiet, kinds=kinds, name=backend),
        contention.ContentionMonitor(spec.run_id, own_busy=launch.nproc_per_node) as monitor,
    ):
        outcome = run_job(
            files, job_argv(spec, rd.path, backend, repeat), launch.job_timeout_s, env=job_env(spec, backend)
        )
    files.write_contention([f.to_dict() for f in monitor.findings])
    if spec.trace.mode == "nsys":
        from moelab.tracing.nsys import collect_reports

        collect_reports(files, launch.world if launch.nodes == 1 else None)  # other nodes keep their own
    after = _health(spec, files, "after")
    if before is not None and after is not None:
        from moelab.health.snapshot import diff, is_suspect

        found = diff(before, after)  # type: ignore[arg-type]
        bad = [f for f in found if f.status in ("warn", "fail")]
        reason = "; ".join(f"{f.subject}: {f.reason}" for f in bad)[:1000] or "health worsened during the run"
        suspect = is_suspect(found)
        files.write_health_diff(
            {
                "suspect": suspect,
                "suspect_reason": reason if suspect else None,
                "findings": [f.to_dict() for f in found],
            }
        )
    return outcome


def job_name(spec: RunSpec, backend: str, repeat: int) -> str:
    """How the console and RunOutcome.jobs name one start of a job: the backend, and with --repeat N which
    start it is (`nccl-a2a 2/3`)."""
    return backend if spec.launch.repeats == 1 else f"{backend} {repeat + 1}/{spec.launch.repeats}"


def _run_dir_unwritable(
    rd: RunDir, spec: RunSpec, backend: str, done: list[str], db_path: Path, exc: OSError
) -> MoelabError:
    """A run directory that cannot be written (ENOSPC) ends the run with the cause and what did not run,
    its run.json marked failed where that still can be written (else `moelab ingest` finds the launcher
    gone and marks it interrupted)."""
    not_run = [b for b in spec.backends if b not in done and b != backend]
    cause = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    with contextlib.suppress(OSError):
        rd.set_status("failed", reason=f"run directory not writable during {backend}: {cause}")
    return MoelabError(
        f"cannot write run directory {rd.path} during backend {backend} ({cause})"
        + (f"; not run: {', '.join(not_run)}" if not_run else "")
        + f"; what finished is kept: store it with `moelab ingest {rd.path} --db {db_path}` once there is room"
    )


def _check_in_place(anchor: RunDirAnchor, db_path: Path, registration: run_registry.Registration) -> None:
    """Stop, with advice naming where the run directory is now, when it was moved or deleted mid-run."""
    now = anchor.moved_to()
    if now is None:
        return
    registration.close()
    raise MoelabError(
        f"run directory {anchor.path} was moved to {now} while the run went on: nothing more is run there; "
        f"store what finished with `moelab ingest {now} --db {db_path}`"
    )


def is_launching_host(spec: RunSpec) -> bool:
    """Only one host writes the database: the single host, node 0 under torchrun, task 0's host under SLURM."""
    if spec.launch.launcher == "torchrun":
        return (spec.launch.node_rank or 0) == 0
    return True


def execute(
    spec: RunSpec,
    runs_root: Path,
    db_path: Path,
    progress: Callable[[str], None] = print,
    quiet: bool = False,
) -> RunOutcome:
    # torchrun multi-node runs this on every node with the same run id: a node other than the launching
    # host keeps its copy under node<R>/, so nodes sharing a filesystem (--out, or the default under a
    # shared home) do not collide on one folder
    root = runs_root if is_launching_host(spec) else runs_root / f"node{spec.launch.node_rank}"
    try:
        rd = RunDir.create(root, spec)
    except FileExistsError:
        raise MoelabError(f"run directory {root / spec.run_id} already exists: give a new --run-id") from None
    jobs: dict[str, JobOutcome] = {}
    trace_notes: dict[str, str] = {}
    anchor = RunDirAnchor(rd.path)
    registration = run_registry.start_registration(spec.run_id)  # other moelab runs on this host see this one
    with RunInterrupt(rd) as stop, contextlib.closing(anchor):  # SIGINT/SIGTERM: stop, store what finished
        for backend, repeat in spec.job_order():
            if stop.requested:
                break
            _check_in_place(anchor, db_path, registration)
            files, name = rd.job(backend, repeat), job_name(spec, backend, repeat)
            progress(
                f"[{name}] {len(spec.cases_for(backend))} cases on {spec.launch.world} {spec.launch.device} ranks …"
            )
            cls = registry.load(backend)
            try:
                if issubclass(cls, HostJob):
                    outcome = cls.run_job(spec, files)
                else:
                    outcome = run_backend(spec, rd, backend, quiet, repeat)
            except OSError as exc:  # the run directory cannot be written (a full disk): say so, stop here
                _check_in_place(anchor, db_path, registration)  # or it was moved away mid-job
                done = list(dict.fromkeys(name.split(" ")[0] for name in jobs))  # backends that ran
                raise _run_dir_unwritable(rd, spec, backend, done, db_path, exc) from exc
            if stop.requested:
                note_interrupted_job(files, str(stop.signal_name))
            jobs[name] = outcome
            progress(f"[{name}] job {outcome.describe()} ({outcome.duration_s:.1f} s)")
            note = files.read_nsys_traces().get("note")
            if note:
                trace_notes[name] = note
                progress(f"[{name}] warning: --trace nsys: {note}")
        registration.close()
        if stop.requested:
            rd.set_status("interrupted", signal=stop.signal_name)
        else:
            rd.set_status("complete" if all(j.ok for j in jobs.values()) else "failed")
        ingested = is_launching_host(spec)
        if ingested:
            _check_in_place(anchor, db_path, registration)
            try:
                with open_db(db_path) as con:
                    ingest(con, rd.path)
                    judge(con, spec.run_id)
            except Exception as exc:  # the measurements are on disk: say how to store them later
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                what = (
                    first
                    if isinstance(exc, MoelabError)
                    else f"storing run {spec.run_id} failed ({type(exc).__name__}: {first})"
                )
                raise MoelabError(
                    f"{what}; its run directory is kept: store it with `moelab ingest {rd.path} --db {db_path}`"
                ) from exc
    return RunOutcome(spec.run_id, rd.path, jobs, ingested, stop.signal_name, trace_notes)
