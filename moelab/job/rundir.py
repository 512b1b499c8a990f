"""The run directory, the durable unit of a run. Workers and launchers write it; only ingest reads it
into the database, so a crash or a hang leaves what was measured on disk and the database untouched.

RUN_DIR/spec.json                      the RunSpec every rank reads
RUN_DIR/run.json                       status (running / complete / failed / interrupted), timestamps,
                                       and the launching process (pid, host) while it runs
RUN_DIR/peaks.json                     the machine's link figures, measured by the run's first GPU job
RUN_DIR/rates.json                     and its GPUs' dense matmul and HBM copy rates (the e2e roofline's)
RUN_DIR/<backend>/progress.jsonl       the writing rank's progress events (cases, one-time costs)
RUN_DIR/<backend>/results.jsonl        one record per case, appended by rank 0 as each case ends
RUN_DIR/<backend>/env.json             per-rank environment fingerprints
RUN_DIR/<backend>/rank<R>.log          each rank's stdout and stderr (faulthandler tracebacks land here)
RUN_DIR/<backend>/rank<R>.error.json   the exception that ended a rank
RUN_DIR/<backend>/rank<R>.stack.txt    every thread's stack, dumped when the launcher stopped a hung rank
RUN_DIR/<backend>/job.json             the launcher's outcome: command, exit code or signal, timeout, tails
RUN_DIR/<backend>/launcher.log         the launcher's (torchrun's) own output
RUN_DIR/<backend>/health_<phase>.json  health snapshots before and after the job, with
RUN_DIR/<backend>/health_<phase>_verdict.json  their verdicts, and
RUN_DIR/<backend>/health_diff.json     what worsened in between
RUN_DIR/<backend>/contention.json      what shared the machine during the job
RUN_DIR/<backend>/nsys_traces.json     the nsys reports of the job's ranks, or why there are none
RUN_DIR/<backend>/traces/              profiler output: <case>/rank<R>.json (torch), <backend>_rank<R>.* (nsys)
RUN_DIR/<backend>/r<K>/                with --repeat N, the K-th further start of the job (K = 1 .. N-1):
                                       the same files as its first start, which stays in RUN_DIR/<backend>
RUN_DIR/verify/                        `moelab verify`: each library test's log, and
RUN_DIR/verify/library_figures.json    each library figure beside moelab's

Every name is written here and nowhere else: other modules ask JobFiles and RunDir for paths.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from moelab.core.case_record import CaseRecord
from moelab.core.library_figures import VerifyRow
from moelab.core.spec import RunSpec

RUNDIR_VERSION = 1
LIBRARY_FIGURES = Path("verify") / "library_figures.json"
HEALTH_PHASES = ("before", "after")
RANK_FILES = {
    "log": ".log",
    "error": ".error.json",
    "stack": ".stack.txt",
}  # rank<R><suffix> in a job's folder


def safe_name(part: str) -> str:
    """A case id as one path component (ids hold '/' only by accident, but must never escape the folder)."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", part)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22): with the pid, it names one
    process even after the pid is reused. None where /proc is missing or the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


REPEAT_DIR = re.compile(r"r([1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class JobFiles:
    """The files of one start of a backend's job: `repeat` 0 is the first (and, without --repeat, only)
    start, in RUN_DIR/<backend>; a later start K keeps the same files in RUN_DIR/<backend>/r<K>."""

    run_dir: Path
    backend: str
    repeat: int = 0

    @property
    def dir(self) -> Path:
        base = self.run_dir / self.backend
        return base if self.repeat == 0 else base / f"r{self.repeat}"

    @property
    def worker_args(self) -> tuple[str, ...]:
        """What a rank of this job is started with (moelab.measure.worker RUN_DIR BACKEND [REPEAT])."""
        base = (str(self.run_dir), self.backend)
        return base if self.repeat == 0 else (*base, str(self.repeat))

    @classmethod
    def of_worker(cls, argv: Sequence[str]) -> JobFiles:
        """The job files of a worker started with `argv` (worker_args)."""
        return cls(Path(argv[0]), argv[1], int(argv[2]) if len(argv) > 2 else 0)

    def rank_log(self, rank: int) -> Path:
        return self.dir / f"rank{rank}{RANK_FILES['log']}"

    def rank_files(self, kind: str) -> dict[int, Path]:
        """Each rank's file of `kind` (log, error, stack) that exists, by rank."""
        suffix = RANK_FILES[kind]
        out = {}
        for path in self.dir.glob(f"rank*{suffix}"):
            name = path.name.removesuffix(suffix).removeprefix("rank")
            if name.isdigit():
                out[int(name)] = path
        return dict(sorted(out.items()))

    @property
    def results(self) -> Path:
        return self.dir / "results.jsonl"

    @property
    def progress(self) -> Path:
        return self.dir / "progress.jsonl"

    @property
    def launcher_log(self) -> Path:
        return self.dir / "launcher.log"

    @classmethod
    def of_dir(cls, job_dir: Path) -> JobFiles:
        """The files of the job whose folder is `job_dir` (RUN_DIR/<backend>, or RUN_DIR/<backend>/r<K>)."""
        job_dir = Path(job_dir)
        found = REPEAT_DIR.fullmatch(job_dir.name)
        if found and (job_dir.parent.parent / "spec.json").exists():
            return cls(job_dir.parent.parent, job_dir.parent.name, int(found.group(1)))
        return cls(job_dir.parent, job_dir.name)

    @property
    def job_file(self) -> Path:
        return self.dir / "job.json"

    def error_file(self, rank: int | str) -> Path:
        return self.dir / f"rank{rank}{RANK_FILES['error']}"

    def stack_file(self, rank: int | str) -> Path:
        return self.dir / f"rank{rank}{RANK_FILES['stack']}"

    @property
    def traces_dir(self) -> Path:
        return self.dir / "traces"

    def torch_trace(self, case_id: str, rank: int, suffix: str = ".json") -> Path:
        """traces/<case>/rank<R>.json: one folder per case, loadable by HTA as a whole."""
        return self.traces_dir / safe_name(case_id) / f"rank{rank}{suffix}"

    @property
    def nsys_prefix(self) -> Path:
        """nsys profile's -o: each rank's report is <prefix>_rank<R>.nsys-rep (moelab.tracing.nsys)."""
        return self.traces_dir / self.backend

    def write_health(self, phase: str, snapshot_json: str, verdict: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / f"health_{phase}.json").write_text(snapshot_json)
        _write_json_atomic(self.dir / f"health_{phase}_verdict.json", verdict)

    def read_health(self, phase: str) -> tuple[str, dict[str, Any]] | None:
        """(the snapshot's JSON text, its verdict) of `phase`, or None when none was taken."""
        snap = self.dir / f"health_{phase}.json"
        if not snap.exists():
            return None
        verdict = self.dir / f"health_{phase}_verdict.json"
        return snap.read_text(), json.loads(verdict.read_text()) if verdict.exists() else {}

    def write_health_diff(self, diff: dict[str, Any]) -> None:
        _write_json_atomic(self.dir / "health_diff.json", diff)

    def read_health_diff(self) -> dict[str, Any] | None:
        p = self.dir / "health_diff.json"
        return json.loads(p.read_text()) if p.exists() else None

    def write_contention(self, findings: list[dict[str, Any]]) -> Path:
        path = self.dir / "contention.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(path, {"findings": findings})
        return path

    def read_contention(self) -> list[dict[str, Any]]:
        p = self.dir / "contention.json"
        return list(json.loads(p.read_text()).get("findings", [])) if p.exists() else []

    def write_nsys_traces(self, traces: list[dict[str, Any]], note: str | None) -> None:
        _write_json_atomic(self.dir / "nsys_traces.json", {"traces": traces, "note": note})

    def read_nsys_traces(self) -> dict[str, Any]:
        p = self.dir / "nsys_traces.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def append_result(self, record: CaseRecord | dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        line = (
            record.to_json() if isinstance(record, CaseRecord) else json.dumps(record, default=_json_default)
        )
        with self.results.open("a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read_results(self) -> list[CaseRecord]:
        if not self.results.exists():
            return []
        out = []
        for line in self.results.read_text().splitlines():
            if not line.strip():
                continue
            try:
                out.append(CaseRecord.from_json(line))
            except json.JSONDecodeError:
                break  # a line cut by a crash mid-write: everything before it is good
        return out

    def write_env(self, envs: list[dict[str, Any]]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(self.dir / "env.json", envs)

    def read_env(self) -> list[dict[str, Any]]:
        p = self.dir / "env.json"
        return json.loads(p.read_text()) if p.exists() else []

    def write_job(self, job: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(self.job_file, job)

    def read_job(self) -> dict[str, Any] | None:
        return json.loads(self.job_file.read_text()) if self.job_file.exists() else None

    def log_tails(self, lines: int = 20) -> dict[int, str]:
        tails = {}
        for rank, log in self.rank_files("log").items():
            with log.open(errors="replace") as fh:
                tails[rank] = "".join(deque(fh, maxlen=lines))
        return tails


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "__slots__"):
        return {k: getattr(obj, k) for k in obj.__slots__}
    if isinstance(obj, float):
        return None
    return str(obj)


@dataclass(frozen=True, slots=True)
class RunDir:
    path: Path

    @classmethod
    def create(cls, root: Path, spec: RunSpec) -> RunDir:
        path = root / spec.run_id
        path.mkdir(parents=True, exist_ok=False)
        rd = cls(path)
        spec.write(rd.spec_file)
        # who runs it: `moelab ingest` tells a run still going from one whose launcher died
        rd.set_status(
            "running", pid=os.getpid(), host=socket.gethostname(), pid_start=process_start(os.getpid())
        )
        return rd

    @property
    def spec_file(self) -> Path:
        return self.path / "spec.json"

    @property
    def spec(self) -> RunSpec:
        return RunSpec.read(self.spec_file)

    @property
    def peaks_file(self) -> Path:
        return self.path / "peaks.json"

    @property
    def rates_file(self) -> Path:
        return self.path / "rates.json"

    @property
    def verify_dir(self) -> Path:
        return self.path / "verify"

    def job(self, backend: str, repeat: int = 0) -> JobFiles:
        return JobFiles(self.path, backend, repeat)

    def starts(self, backend: str) -> list[JobFiles]:
        """Every start of `backend`'s job the spec asks for (--repeat), first to last."""
        return [self.job(backend, k) for k in range(self.spec.launch.repeats)]

    def set_status(self, status: str, **extra: Any) -> None:
        info = self.info()
        info.update({"rundir_version": RUNDIR_VERSION, "status": status, f"{status}_at": now_iso(), **extra})
        _write_json_atomic(self.path / "run.json", info)

    def info(self) -> dict[str, Any]:
        p = self.path / "run.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def write_library_figures(self, rows: Sequence[VerifyRow]) -> Path:
        """`moelab verify`'s rows, kept in the run directory so a re-ingest restores them."""
        path = self.path / LIBRARY_FIGURES
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([r.to_dict() for r in rows], indent=2))
        return path

    def library_figures(self) -> list[VerifyRow]:
        """The rows `moelab verify` wrote (none when verify never ran on this run)."""
        path = self.path / LIBRARY_FIGURES
        if not path.exists():
            return []
        return [VerifyRow.from_dict(d) for d in json.loads(path.read_text())]
