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

import errno
import json
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from moelab.core.case_record import RECORD_VERSION, CaseRecord
from moelab.core.library_figures import VerifyRow
from moelab.core.peaks import MeasuredPeak, MeasuredRate
from moelab.core.spec import SPEC_VERSION, RunSpec
from moelab.core.validate import plain_name_problem
from moelab.job.safe_read import RunDirFileError, expect, iter_lines, read_json, tail_text

RUNDIR_VERSION = 1
LIBRARY_FIGURES = Path("verify") / "library_figures.json"
HEALTH_PHASES = ("before", "after")
RANK_FILES = {
    "log": ".log",
    "error": ".error.json",
    "stack": ".stack.txt",
    "heartbeat": ".heartbeat",  # touched every second while the rank lives (moelab.job.heartbeat)
}  # rank<R><suffix> in a job's folder


def safe_name(part: str) -> str:
    """A case id as one path component (ids hold '/' only by accident, but must never escape the folder)."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", part)


PEAKS = "peaks.json"
# job.json's fields that ingest reads, with the JSON types the launcher writes (moelab.job.local.JobOutcome)
JOB_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "returncode": int,
    "signal": str,
    "timed_out": (bool, int),
    "duration_s": (int, float),
    "description": str,
    "interrupted": (str, bool),
    "failed_ranks": list,
    "stderr_tails": dict,
    "argv": list,
}
_CASE_ID_RE = re.compile(rb'"case_id":\s*("(?:[^"\\]|\\.)*")')


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

    def ensure_dir(self) -> None:
        """Make the job's folder inside the run directory, never the run directory itself: a run directory
        moved or deleted mid-run was re-created at its old path, without spec.json, by the next write."""
        if not self.run_dir.is_dir():
            raise FileNotFoundError(
                errno.ENOENT, "the run directory is gone (moved or deleted)", str(self.run_dir)
            )
        self.dir.mkdir(parents=True, exist_ok=True)

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

    def heartbeat_file(self, rank: int | str) -> Path:
        return self.dir / f"rank{rank}{RANK_FILES['heartbeat']}"

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
        self.ensure_dir()
        (self.dir / f"health_{phase}.json").write_text(snapshot_json)
        _write_json_atomic(self.dir / f"health_{phase}_verdict.json", verdict)

    def read_health(self, phase: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(the snapshot, its verdict) of `phase`, or None when none was taken."""
        snapshot = self.read_json_file(f"health_{phase}.json")
        if snapshot is None:
            return None
        return snapshot, self.read_json_file(f"health_{phase}_verdict.json") or {}

    def write_health_diff(self, diff: dict[str, Any]) -> None:
        _write_json_atomic(self.dir / "health_diff.json", diff)

    def read_health_diff(self) -> dict[str, Any] | None:
        return self.read_json_file("health_diff.json")

    def write_contention(self, findings: list[dict[str, Any]]) -> Path:
        path = self.dir / "contention.json"
        self.ensure_dir()
        _write_json_atomic(path, {"findings": findings})
        return path

    def read_contention(self) -> list[dict[str, Any]]:
        data = self.read_json_file("contention.json") or {}
        found = expect(data.get("findings", []), list, str(self.dir / "contention.json"))
        return [expect(f, dict, str(self.dir / "contention.json")) for f in found]

    def write_nsys_traces(self, traces: list[dict[str, Any]], note: str | None) -> None:
        _write_json_atomic(self.dir / "nsys_traces.json", {"traces": traces, "note": note})

    def read_nsys_traces(self) -> dict[str, Any]:
        return self.read_json_file("nsys_traces.json") or {}

    def append_result(self, record: CaseRecord | dict[str, Any]) -> None:
        self.ensure_dir()
        line = (
            record.to_json() if isinstance(record, CaseRecord) else json.dumps(record, default=_json_default)
        )
        with self.results.open("a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def scan_results(self) -> ResultsScan:
        """Every record of results.jsonl, and each line that is not one, by line number. A line cut by a
        crash mid-write, or any other bad line, never hides the good records after it. A record of another
        version is refused (RunDirFileError naming both versions): its fields may mean something else."""
        scan = ResultsScan()
        where = f"{self.backend}/results.jsonl"
        for number, raw, ended in iter_lines(self.results):
            if not raw.strip():
                continue
            data, why = _record_json(raw, ended)
            if why is None:
                if data.get("version") != RECORD_VERSION:
                    raise RunDirFileError(
                        f"{self.results} line {number}: case record version {data.get('version')!r}, "
                        f"this moelab reads version {RECORD_VERSION}: ingest it with the moelab that wrote it"
                    )
                try:
                    scan.records.append(CaseRecord.from_dict(data))
                    continue
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    why = f"not a case record ({type(exc).__name__}: {str(exc)[:200]})"
            scan.problems.append(LineProblem(file=where, line=number, reason=why, case_id=_case_id_in(raw)))
        return scan

    def write_env(self, envs: list[dict[str, Any]]) -> None:
        self.ensure_dir()
        _write_json_atomic(self.dir / "env.json", envs)

    def read_env(self) -> list[dict[str, Any]]:
        p = self.dir / "env.json"
        envs = expect(read_json(p) or [], list, str(p))
        return [expect(e, dict, f"{p} (an entry)") for e in envs]

    def write_job(self, job: dict[str, Any]) -> None:
        self.ensure_dir()
        _write_json_atomic(self.job_file, job)

    def read_job(self) -> dict[str, Any] | None:
        """job.json (None before the job ended), its fields of the types the launcher writes."""
        p = self.job_file
        job = read_json(p)
        if job is None:
            return None
        expect(job, dict, str(p))
        for name, kinds in JOB_FIELD_TYPES.items():
            if job.get(name) is not None and not isinstance(job[name], kinds):
                raise RunDirFileError(
                    f"{p}: field {name!r} is a {type(job[name]).__name__}, not as a launcher writes it"
                )
        if not all(isinstance(f, dict) for f in job.get("failed_ranks") or []):
            raise RunDirFileError(f"{p}: field 'failed_ranks' is not a list of objects")
        return job  # type: ignore[no-any-return]

    def read_json_file(self, name: str) -> dict[str, Any] | None:
        """A JSON object the runner wrote beside the job (health_before.json, health_diff.json,
        nsys_traces.json, ...), read as data (`moelab.job.safe_read`); None when it is not there."""
        p = self.dir / name
        data = read_json(p)
        return None if data is None else expect(data, dict, str(p))

    def log_tails(self, lines: int = 20) -> dict[int, str]:
        """Each rank log's last `lines` lines, read from its last bytes only; a log that is a link or not a
        plain file is not read."""
        tails = {}
        for rank, log in self.rank_files("log").items():
            if (tail := tail_text(log, lines)) is not None:
                tails[rank] = tail
        return tails


@dataclass(frozen=True, slots=True)
class LineProblem:
    """A results.jsonl line that is not a record (cut mid-write, not UTF-8, not JSON, not a record), and
    the case it was about where its text still names one."""

    file: str  # relative to the run directory
    line: int
    reason: str
    case_id: str | None = None

    def text(self) -> str:
        return f"{self.file} line {self.line}: {self.reason}"


@dataclass(slots=True)
class ResultsScan:
    records: list[CaseRecord] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)


def _record_json(raw: bytes, ended: bool) -> tuple[Any, str | None]:
    """The JSON object of one line, or why the line is not one."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
    except (json.JSONDecodeError, RecursionError) as exc:
        if not ended:
            return None, "cut before its end (the writer stopped mid-line)"
        return None, f"not valid JSON ({getattr(exc, 'msg', 'nested too deeply')})"
    if not isinstance(data, dict):
        return None, f"not a case record (a JSON {type(data).__name__})"
    return data, None


def _case_id_in(raw: bytes) -> str | None:
    """The case id a (cut) record line names: a record starts with its case, and the case with its id."""
    m = _CASE_ID_RE.search(raw[:4096])
    if m is None:
        return None
    try:
        value = json.loads(m.group(1).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, str) else None


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
        """spec.json, or a RunDirFileError naming the file (another version's spec is refused by both
        version numbers: its fields may mean something else)."""
        p = self.spec_file
        data = read_json(p)
        if data is None:
            raise RunDirFileError(f"{self.path} is not a run directory (no spec.json)")
        expect(data, dict, str(p))
        if data.get("spec_version") != SPEC_VERSION:
            raise RunDirFileError(
                f"{p}: run spec version {data.get('spec_version')!r}, this moelab reads version {SPEC_VERSION}: "
                "ingest it with the moelab that wrote it"
            )
        try:
            spec = RunSpec.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RunDirFileError(f"{p}: not a run spec ({type(exc).__name__}: {str(exc)[:200]})") from None
        # names that become folders, keys and words on every line: as `moelab run` checks them (a spec.json
        # not written by moelab printed its run id's ESC bytes raw, and a backend '../x' reads another folder)
        names = [(spec.run_id, "its run id"), *((b, "its backend") for b in spec.backends)]
        for name, what in names:
            problem = plain_name_problem(name, what) if isinstance(name, str) else f"{what} is not text"
            if problem is not None:
                raise RunDirFileError(f"{p}: {problem}")
        return spec

    @property
    def peaks_file(self) -> Path:
        return self.path / PEAKS

    @property
    def rates_file(self) -> Path:
        return self.path / "rates.json"

    @property
    def verify_dir(self) -> Path:
        return self.path / "verify"

    def job(self, backend: str, repeat: int = 0) -> JobFiles:
        return JobFiles(self.path, backend, repeat)

    def starts(self, backend: str) -> list[JobFiles]:
        """Every start of `backend`'s job the spec asks for (--repeat), first to last. A job's folder that is
        a symbolic link is refused, as its files are: ingest read another run's job through one, whole."""
        found = [self.job(backend, k) for k in range(self.spec.launch.repeats)]
        for files in found:
            for folder in (self.path / backend, files.dir):
                if folder.is_symlink():
                    raise RunDirFileError(
                        f"{folder} is a symbolic link: moelab reads the folders it wrote, not what a link points to"
                    )
        return found

    def set_status(self, status: str, **extra: Any) -> None:
        info = self.info()
        info.update({"rundir_version": RUNDIR_VERSION, "status": status, f"{status}_at": now_iso(), **extra})
        _write_json_atomic(self.path / "run.json", info)

    def info(self) -> dict[str, Any]:
        """run.json ({} before it is written); a newer run-directory layout is refused naming both versions."""
        p = self.path / "run.json"
        info = expect(read_json(p) or {}, dict, str(p))
        version = info.get("rundir_version", RUNDIR_VERSION)
        if version != RUNDIR_VERSION:
            raise RunDirFileError(
                f"{p}: run directory version {version!r}, this moelab reads version {RUNDIR_VERSION}"
            )
        return info

    def peaks(self) -> list[MeasuredPeak]:
        """The link peaks the first GPU job measured (peaks.json; none on CPU runs)."""
        p = self.peaks_file
        rows = expect(read_json(p) or [], list, str(p))
        try:
            return [MeasuredPeak(**expect(d, dict, str(p))) for d in rows]
        except TypeError as exc:
            raise RunDirFileError(f"{p}: not a list of measured peaks ({exc})") from None

    def write_library_figures(self, rows: Sequence[VerifyRow]) -> Path:
        """`moelab verify`'s rows, kept in the run directory so a re-ingest restores them."""
        path = self.path / LIBRARY_FIGURES
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([r.to_dict() for r in rows], indent=2))
        return path

    def rates(self) -> list[MeasuredRate]:
        """The GPU's dense matmul and HBM copy rates the first GPU job measured (rates.json; none on CPU)."""
        p = self.rates_file
        rows = expect(read_json(p) or [], list, str(p))
        try:
            return [MeasuredRate(**expect(d, dict, str(p))) for d in rows]
        except TypeError as exc:
            raise RunDirFileError(f"{p}: not a list of measured rates ({exc})") from None

    def library_figures(self) -> list[VerifyRow]:
        """The rows `moelab verify` wrote (none when verify never ran on this run)."""
        path = self.path / LIBRARY_FIGURES
        rows = expect(read_json(path) or [], list, str(path))
        try:
            return [VerifyRow.from_dict(expect(d, dict, str(path))) for d in rows]
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirFileError(f"{path}: not a list of library figures ({exc})") from None
