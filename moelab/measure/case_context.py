"""What every case runner of a job shares: the backend, its rank's context, the run's spec, the clock and
the job's files."""

from __future__ import annotations

from dataclasses import dataclass

from moelab.backends.base import Backend, BackendContext
from moelab.core.spec import RunSpec
from moelab.job.events import ProgressEvents
from moelab.job.rundir import JobFiles
from moelab.measure.timing import Clock


@dataclass(frozen=True, slots=True)
class CaseContext:
    backend: Backend
    ctx: BackendContext
    spec: RunSpec
    clock: Clock
    files: JobFiles | None
    events: ProgressEvents | None = None  # rank 0's progress file: which op of which case is running
