"""Why a backend job failed: each rank's exception, its last log lines, and where it was stuck.

Files a rank leaves in RUN_DIR/<backend>/ (next to rank<R>.log):
- rank<R>.error.json  the exception that ended the worker (type, message, traceback), written by the
                      worker's top-level `except` (`record_worker_error`).
- rank<R>.stack.txt   every thread's Python stack, dumped by faulthandler on SIGUSR1: the launcher sends
                      it to the ranks of a job that ran past --timeout, waits, then kills the job
                      (moelab.job.local). faulthandler writes from C, so it works while the rank is
                      stuck in a C call holding the GIL (a kernel wait, a socket read).
- rank<R>.log         on SIGTERM (torchrun stopping the surviving ranks after one failed) faulthandler dumps
                      the stacks here before the rank dies; a segfault's "Fatal Python error" lands here too.

`read_diagnosis(job_dir)` turns them into a typed `JobDiagnosis`; `diagnosis_rows` gives its rows for the
store (table `failure_diagnosis`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from moelab.job.heartbeat import first_silent
from moelab.job.rundir import JobFiles
from moelab.job.safe_read import RunDirFileError, read_json, read_tail

STACK_SIGNAL = signal.SIGUSR1
TAIL_LINES = 20
MAX_TEXT = 20_000
TAIL_BYTES = 1 << 20  # of a rank log: where a faulthandler dump is found, at its end
# exceptions that are the consequence of another rank failing, not a cause
CONSEQUENCE_RE = re.compile(
    r"Connection closed by peer|Connection reset|timed out|Timed out|timeout|Broken pipe|"
    r"DistBackendError|DistNetworkError|NCCL communicator was aborted|ProcessGroup.*abort",
)
_THREAD_HEADER_RE = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+.*\(most recent call first\):\s*$")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_FATAL_RE = re.compile(r"^Fatal Python error: (?P<what>.+)$")

_open_stack_files: list[IO[str]] = []  # faulthandler writes to these fds: keep them open for the process


def install_stack_dumps(job_dir: Path, rank: int) -> None:
    """In a worker rank: dump every thread's stack to rank<R>.stack.txt on SIGUSR1 (and go on), and to
    stderr (the rank log) on SIGTERM, then die of it as before."""
    fh = JobFiles.of_dir(job_dir).stack_file(rank).open("a")
    _open_stack_files.append(fh)
    faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)


STACK_DUMP_WAIT_S = 1.5
WORKER_MODULE_ARG = "moelab.measure.worker"


def worker_pids(pids: Sequence[int]) -> list[int]:
    """The moelab worker ranks among `pids`: Python processes running `-m moelab.measure.worker`. Only
    they handle SIGUSR1 (to the torchrun agent, nsys or a wrapper it is a fatal signal)."""
    out = []
    for pid in pids:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in args if a]
        # the module python runs is the word after its first -m (torchrun's agent runs torch.distributed.run
        # with the worker module among its own arguments)
        module = words[words.index("-m") + 1] if "-m" in words[:-1] else None
        if words and Path(words[0]).name.startswith("python") and module == WORKER_MODULE_ARG:
            out.append(pid)
    return out


def with_descendants(pids: Sequence[int]) -> list[int]:
    """`pids` and every process below them. torchrun starts each rank in a session of its own
    (start_new_session=True in torch.distributed.elastic's SubprocessHandler), so the ranks are found
    through parent links, not through the job's session."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.append(pid)
            todo += children.get(pid, [])
    return out


def request_stack_dumps(pids: Sequence[int], wait_s: float = STACK_DUMP_WAIT_S) -> list[int]:
    """Send SIGUSR1 to the worker ranks among `pids` and their descendants, and give faulthandler
    `wait_s` to write; returns the ranks' pids signalled (the caller kills the job afterwards)."""
    import time

    sent = []
    for pid in worker_pids(with_descendants(pids)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, STACK_SIGNAL)
            sent.append(pid)
    if sent:
        time.sleep(wait_s)
    return sent


def record_worker_error(argv: Sequence[str], exc: BaseException) -> None:
    """In a worker's top-level `except`: write rank<R>.error.json for the exception that ends it.
    `argv` is the worker's (RUN_DIR BACKEND [REPEAT]); the rank is the launcher's RANK (or the pid before it is
    known). Never raises: it runs on the way out of a failing process."""
    with contextlib.suppress(Exception):
        files = JobFiles.of_worker(argv)
        rank = os.environ.get("RANK") or f"-pid{os.getpid()}"
        data = {
            "rank": int(rank) if rank.isdigit() else None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "type": _type_name(exc),
            "message": str(exc)[:MAX_TEXT],
            "traceback": "".join(traceback.format_exception(exc))[-MAX_TEXT:],
        }
        files.ensure_dir()
        path = files.error_file(rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


@dataclass(frozen=True, slots=True)
class RankError:
    """What ended one rank: an exception it raised, or a fatal signal faulthandler reported."""

    rank: int
    type: str
    message: str
    traceback: str
    source: str  # "exception" (rank<R>.error.json) or "fatal" (faulthandler in the rank log)
    at: float | None = None  # when it was written (file mtime): the earliest cause is the root

    @property
    def is_consequence(self) -> bool:
        """A collective that timed out or lost its peer: what a rank sees when another one failed."""
        return bool(CONSEQUENCE_RE.search(f"{self.type}: {self.message}"))

    def line(self) -> str:
        message = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return (
            f"rank {self.rank}: {self.type}: {message}"[:300] if message else f"rank {self.rank}: {self.type}"
        )


@dataclass(frozen=True, slots=True)
class RankStack:
    """Every thread's Python stack of one rank, and the innermost frame of its worker (main) thread."""

    rank: int
    trigger: str  # "timeout" (SIGUSR1 before the kill), "stopped" (SIGTERM), "fatal" (a crash)
    text: str
    where: str | None  # "file.py:53 in dispatch"

    def line(self) -> str:
        what = {"timeout": "stuck", "stopped": "was", "fatal": "crashed"}.get(self.trigger, "was")
        return (
            f"rank {self.rank} {what} at {self.where}" if self.where else f"rank {self.rank}: no Python frame"
        )


@dataclass(frozen=True, slots=True)
class JobDiagnosis:
    backend: str
    errors: tuple[RankError, ...] = ()
    stacks: tuple[RankStack, ...] = ()
    tails: dict[int, str] = field(default_factory=dict)
    last_beats: dict[int, float] = field(default_factory=dict)  # each rank's last heartbeat (file mtime)

    @property
    def stopped_first(self) -> tuple[int, float] | None:
        """(rank, seconds before the next) of the rank whose heartbeat ended first, when one stands out."""
        return first_silent(self.last_beats)

    def culprit(self) -> tuple[int, str] | None:
        """(rank, line) of a rank that caused the failure without saying so, when the errors name only
        consequences: the rank whose heartbeat ended first (SIGSTOP, a hang of its whole process), else
        the one rank that left neither an error nor a stack while its peers lost it (an exit mid-job)."""
        cause = self.root_cause
        blamed = cause.rank if isinstance(cause, RankError) and not cause.is_consequence else None
        silent = self.stopped_first
        if silent is not None and silent[0] != blamed:
            return silent[0], (
                f"rank {silent[0]} stopped first (its heartbeat ended {silent[1]:.0f} s before the other ranks')"
            )
        if blamed is None and self.errors and all(e.is_consequence for e in self.errors):
            said = {e.rank for e in self.errors} | {s.rank for s in self.stacks}
            quiet = [r for r in self.ranks() if r not in said]
            if len(quiet) == 1:
                return quiet[0], f"rank {quiet[0]} ended first, leaving no error (it exited or died mid-job)"
        return None

    @property
    def root_cause(self) -> RankError | RankStack | None:
        """The earliest error that is not a consequence of another rank's (a lost peer, a collective
        timeout), else the earliest error; with no error, the stack of a rank stuck at the timeout."""
        causes = [e for e in self.errors if not e.is_consequence] or list(self.errors)
        if causes:
            return min(causes, key=lambda e: (e.at if e.at is not None else float("inf"), e.rank))
        stacks = [s for s in self.stacks if s.trigger == "timeout"] or list(self.stacks)
        return stacks[0] if stacks else None

    def headline(self) -> str | None:
        """One line saying why: `rank 1: RuntimeError: ...`, or `rank 0 stuck at x.py:53 in dispatch`."""
        cause = self.root_cause
        culprit = self.culprit()
        first = [culprit[1]] if culprit is not None else []
        if cause is None:
            return first[0] if first else None
        parts = [*first, cause.line()]
        if isinstance(cause, RankError):
            parts += [e.line() for e in self.errors if e is not cause and not e.is_consequence][:2]
        else:
            parts += [s.line() for s in self.stacks if s is not cause and s.trigger == cause.trigger][:3]
        return "; ".join(parts)

    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.errors} | {s.rank for s in self.stacks} | set(self.tails))


def _read_error(path: Path, rank: int) -> RankError | None:
    """rank<R>.error.json, or None when it is unreadable (cut by the crash it reports, replaced by a link):
    its fields are capped whatever wrote them."""
    try:
        data = read_json(path, cap=4 * MAX_TEXT)
    except (OSError, RunDirFileError):
        return None
    if not isinstance(data, dict):
        return None
    return RankError(
        rank=rank,
        type=str(data.get("type") or "unknown")[:200],
        message=str(data.get("message") or "")[:MAX_TEXT],
        traceback=str(data.get("traceback") or "")[-MAX_TEXT:],
        source="exception",
        at=path.lstat().st_mtime,
    )


def _tail(path: Path, cap: int = 4 * MAX_TEXT) -> str:
    """The end of a rank's log or stack file (a link or a non-regular file reads as empty)."""
    try:
        data = read_tail(path, cap)
    except (OSError, RunDirFileError):
        return ""
    return (data or b"").decode("utf-8", errors="replace")


def parse_faulthandler(text: str) -> list[tuple[str, list[str]]]:
    """The thread blocks of faulthandler dumps in `text`: (header, frame lines), in order."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if _THREAD_HEADER_RE.match(line):
            current = []
            blocks.append((line.strip(), current))
        elif current is not None and _FRAME_RE.match(line):
            current.append(line.rstrip())
        elif current is not None and line.strip() and not line.startswith(" "):
            current = None
    return blocks


def main_thread_frame(blocks: list[tuple[str, list[str]]]) -> str | None:
    """`file.py:53 in dispatch`: the innermost frame of the thread running the moelab worker (the one
    whose stack holds moelab/measure/worker.py), else of the first thread with frames."""
    chosen = next((frames for _, frames in blocks if any("worker.py" in f for f in frames)), None)
    chosen = chosen or next((frames for _, frames in blocks if frames), None)
    if not chosen:
        return None
    m = _FRAME_RE.match(chosen[0])
    assert m is not None
    return f"{Path(m['file']).name}:{m['line']} in {m['func']}"


def _last_dump(text: str) -> str:
    """The last faulthandler dump in a log: from its first thread header (or the Fatal line before it)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _THREAD_HEADER_RE.match(line)]
    if not starts:
        return ""
    first = starts[-1]
    while first > 0 and (
        _THREAD_HEADER_RE.match(lines[first - 1])
        or _FRAME_RE.match(lines[first - 1])
        or not lines[first - 1].strip()
        or lines[first - 1].startswith("  <")
    ):
        first -= 1
    if first > 0 and _FATAL_RE.match(lines[first - 1]):
        first -= 1
    return "\n".join(lines[first:])[-MAX_TEXT:]


def _from_log(rank: int, log: Path) -> tuple[RankError | None, RankStack | None]:
    dump = _last_dump(_tail(log, TAIL_BYTES))
    if not dump:
        return None, None
    fatal = next((m for line in dump.splitlines() if (m := _FATAL_RE.match(line))), None)
    blocks = parse_faulthandler(dump)
    stack = RankStack(
        rank=rank, trigger="fatal" if fatal else "stopped", text=dump, where=main_thread_frame(blocks)
    )
    error = None
    if fatal:
        error = RankError(
            rank=rank,
            type="Fatal Python error",
            message=fatal["what"][:MAX_TEXT],
            traceback=dump,
            source="fatal",
            at=log.lstat().st_mtime,
        )
    return error, stack


def read_diagnosis(job_dir: Path, tail_lines: int = TAIL_LINES) -> JobDiagnosis:
    """Everything the ranks of one job left about how they ended (empty parts where they left nothing)."""
    job_dir = Path(job_dir)
    files = JobFiles.of_dir(job_dir)
    errors: dict[int, RankError] = {}
    stacks: dict[int, RankStack] = {}
    tails: dict[int, str] = {}
    for rank, path in files.rank_files("error").items():
        if (err := _read_error(path, rank)) is not None:
            errors[rank] = err
    for rank, path in files.rank_files("stack").items():
        text = _tail(path)[-MAX_TEXT:]
        if text.strip():
            stacks[rank] = RankStack(
                rank=rank, trigger="timeout", text=text, where=main_thread_frame(parse_faulthandler(text))
            )
    beats = {}
    for rank, path in files.rank_files("heartbeat").items():
        with contextlib.suppress(OSError):
            beats[rank] = path.lstat().st_mtime
    for rank, log in files.rank_files("log").items():
        tails[rank] = "".join(_tail(log).splitlines(keepends=True)[-tail_lines:])
        fatal, stopped = _from_log(rank, log)
        if fatal is not None and rank not in errors:
            errors[rank] = fatal
        if stopped is not None and rank not in stacks:
            stacks[rank] = stopped
    return JobDiagnosis(
        backend=job_dir.name,
        errors=tuple(errors[r] for r in sorted(errors)),
        stacks=tuple(stacks[r] for r in sorted(stacks)),
        tails=dict(sorted(tails.items())),
        last_beats=beats,
    )


def _job_failed(job_dir: Path) -> bool:
    try:
        job = JobFiles.of_dir(job_dir).read_job()
    except RunDirFileError:
        return True  # ingest names the unreadable file; what the ranks left is still worth reading
    return job is not None and (bool(job.get("timed_out")) or job.get("returncode") not in (0, None))


def diagnosis_rows(run_id: str, job_dir: Path) -> list[tuple[Any, ...]]:
    """Rows of `failure_diagnosis` for a failed, crashed or timed-out job (none for a job that ended ok):
    one per rank, with its exception, stack and log tail; `root_cause` marks the rank the headline names."""
    if not _job_failed(job_dir):
        return []
    diag = read_diagnosis(job_dir)
    cause, culprit = diag.root_cause, diag.culprit()
    cause_rank = culprit[0] if culprit is not None else (cause.rank if cause is not None else None)
    headline = diag.headline()
    errors = {e.rank: e for e in diag.errors}
    stacks = {s.rank: s for s in diag.stacks}
    rows = []
    for rank in sorted(set(diag.ranks()) | ({cause_rank} if cause_rank is not None else set())):
        e, s = errors.get(rank), stacks.get(rank)
        rows.append(
            (
                run_id,
                diag.backend,
                rank,
                e.type if e else None,
                e.message if e else None,
                e.traceback if e else None,
                s.trigger if s else None,
                s.where if s else None,
                s.text if s else None,
                diag.tails.get(rank),
                cause_rank == rank,
                headline,
            )
        )
    return rows
