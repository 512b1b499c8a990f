"""A run from the launching host: run directory → one launched job per backend → ingest in one transaction."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from moelab.launch.local import JobOutcome, launch_local
from moelab.rundir import RunDir
from moelab.spec import RunSpec
from moelab.store.db import open_db
from moelab.store.ingest import ingest


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: str
    run_dir: Path
    jobs: dict[str, JobOutcome]

    @property
    def all_jobs_ok(self) -> bool:
        return all(j.ok for j in self.jobs.values())


def execute(spec: RunSpec, runs_root: Path, db_path: Path, progress: Callable[[str], None] = print) -> RunOutcome:
    rd = RunDir.create(runs_root, spec)
    jobs: dict[str, JobOutcome] = {}
    for backend in spec.backends:
        progress(f"[{backend}] {len(spec.cases_for(backend))} cases on {spec.launch.world} {spec.launch.device} ranks …")
        outcome = launch_local(rd.job(backend), spec.launch.nproc_per_node, spec.launch.job_timeout_s)
        jobs[backend] = outcome
        progress(f"[{backend}] job {outcome.describe()} ({outcome.duration_s:.1f} s)")
    rd.set_status("complete" if all(j.ok for j in jobs.values()) else "failed")
    with open_db(db_path) as con:
        ingest(con, rd.path)
    return RunOutcome(spec.run_id, rd.path, jobs)
