"""Nsight Systems: the per-rank wrapper command, `nsys export --type sqlite`, and the SQLite reader.

Command line (Nsight Systems User Guide, "CLI Profile Command Switch Options",
https://docs.nvidia.com/nsight-systems/UserGuide/index.html):
- `--trace=cuda,nvtx[,osrt]`; `--capture-range=cudaProfilerApi`: collection starts at cudaProfilerStart;
- `--capture-range-end=stop`: "collection will stop at the capture range end. Any subsequent capture
  ranges will be ignored. The target app will continue running" (`repeat[:N]` makes one report per
  range instead); so the worker opens ONE cudaProfilerStart/Stop range per job, around its timed regions;
- `--output=<file>`: "Any `%q{ENV_VAR}` pattern in the filename will be substituted with the value of
  the environment variable" — `%q{RANK}` under torchrun, `%q{SLURM_PROCID}` under srun,
  `%q{OMPI_COMM_WORLD_RANK}` under Open MPI's mpirun. nsys must wrap each rank, not the launcher
  (`nsys profile torchrun …` makes one report, and RANK is not yet set there);
- `--force-overwrite=true`; `--sample=none --cpuctxsw=none` keep the report small (no CPU sampling).
Export: `nsys export --type=sqlite --output=<file> --force-overwrite=true <report>.nsys-rep`.

SQLite schema (Nsight Systems "SQLite Export Schema Reference",
https://docs.nvidia.com/nsight-systems/UserGuide/index.html#exporter-sqlite-schema and
https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html). Tables are created
lazily, so any of them may be missing; times are nanoseconds:
- StringIds(id, value);
- CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, contextId, streamId, correlationId, globalPid,
  demangledName, shortName, mangledName, …): names are StringIds ids;
- CUPTI_ACTIVITY_KIND_RUNTIME(start, end, eventClass, globalTid, correlationId, nameId, …): the CUDA API
  call (runtime and driver launches) whose correlationId matches the kernel's ("Correlate CUDA kernel
  launches with CUDA API kernel launches" in the export docs' examples);
- NVTX_EVENTS(start, end, eventType, rangeId, category, color, text, globalTid, endGlobalTid, textId,
  domainId, …): `text`, or `textId` → StringIds for registered strings; eventType 59 = NvtxPushPopRange,
  60 = NvtxStartEndRange (34 NvtxMark, 75 NvtxDomainCreate; the names are in ENUM_NSYS_EVENT_TYPE);
- globalTid / globalPid are serialized ids: PID = id / 0x1000000 % 0x1000000, TID = id % 0x1000000
  ("Serialized process and thread identifiers" example).
Attribution, the documented way: a kernel belongs to an NVTX range when the CUDA API call that launched
it started inside the range on the range's thread (push/pop ranges are per thread) or, for start/end
ranges, in the range's process. Without a runtime table (CUDA API tracing off) we fall back to GPU-time
overlap: kernels of the process that started inside the range's span.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from moelab.core.errors import MoelabError
from moelab.job.rundir import JobFiles
from moelab.tracing.nvtx_ranges import PREFIX
from moelab.tracing.summary import Event, RangeInstance, TraceSummary, summarize_instances

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
RANK_VAR_FOR_LAUNCHER = {
    "local": "RANK",
    "torchrun": "RANK",
    "slurm": "SLURM_PROCID",
    "mpirun": "OMPI_COMM_WORLD_RANK",
}
CAPTURE_ENDS = ("stop", "repeat", "none")
NVTX_PUSH_POP = 59
NVTX_START_END = 60
NAME_COLUMNS = ("shortName", "demangledName")
NS_PER_US = 1e3


VERSION_PROBE_S = 20.0  # `nsys --version` answers in well under a second


def run_in_session(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """subprocess.run in a session of its own: on a timeout the whole session is killed and reaped. Killing
    only the direct child (subprocess.run's way) left what it had started running (a wrapper script's
    own child), holding the output pipe open."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def nsys_available(nsys: str = "nsys") -> tuple[str | None, str | None]:
    """(path, None) when `nsys` runs here, else (None, one line saying why).

    A copy of nsys without its QdstrmImporter (the one inside Nsight Compute) records .qdstrm files but
    cannot turn them into .nsys-rep reports: that is reported as unusable too.
    """
    path = shutil.which(nsys)
    if path is None:
        return (
            None,
            f"{nsys} not found on PATH: install Nsight Systems (or pass its path) to use --trace nsys",
        )
    try:
        proc = run_in_session([path, "--version"], VERSION_PROBE_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} --version failed: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return None, f"{path} --version exited {proc.returncode}: {tail[-1] if tail else 'no output'}"
    real = Path(path).resolve()
    # full installs: <root>/target-linux-x64/nsys + <root>/host-linux-x64/QdstrmImporter; CUDA toolkit:
    # <cuda>/bin/nsys + <cuda>/nsight-systems-<ver>/host-linux-x64/QdstrmImporter
    roots = [real.parent, real.parent.parent]
    patterns = ("QdstrmImporter", "*/QdstrmImporter", "*/*/QdstrmImporter")
    if not any(any(root.glob(p)) for root in roots for p in patterns):
        return None, (
            f"{path} has no QdstrmImporter beside it (a partial copy, e.g. the one inside Nsight Compute): "
            "it records .qdstrm but cannot make .nsys-rep reports; install Nsight Systems"
        )
    return path, None


def rank_var_for(launcher: str) -> str:
    try:
        return RANK_VAR_FOR_LAUNCHER[launcher]
    except KeyError:
        raise MoelabError(
            f"no rank variable known for launcher {launcher!r}; known: {', '.join(RANK_VAR_FOR_LAUNCHER)}"
        ) from None


def nsys_profile_argv(
    trace: str = "cuda,nvtx", osrt: bool = False, nsys: str = "nsys", capture_end: str = "stop"
) -> list[str]:
    """`nsys profile` and its flags, without the output name (for launch code that appends its own
    `-o <name>_rank%q{VAR}`)."""
    if capture_end not in CAPTURE_ENDS:
        raise MoelabError(f"capture end must be one of {', '.join(CAPTURE_ENDS)}, got {capture_end!r}")
    kinds = [k for k in trace.split(",") if k]
    if osrt and "osrt" not in kinds:
        kinds.append("osrt")
    return [
        nsys,
        "profile",
        f"--trace={','.join(kinds)}",
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={capture_end}",
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=true",
    ]


def nsys_prefix_argv(
    out_dir: Path | str,
    name: str,
    rank_var: str = "RANK",
    trace: str = "cuda,nvtx",
    osrt: bool = False,
    nsys: str = "nsys",
    capture_end: str = "stop",
) -> list[str]:
    """The argv that goes before each rank's `python -m moelab.measure.worker …`: one report per rank,
    `<out_dir>/<name>_rank<R>.nsys-rep`, limited to the cudaProfilerStart/Stop range."""
    if rank_var not in RANK_VARS:
        raise MoelabError(f"rank variable must be one of {', '.join(RANK_VARS)}, got {rank_var!r}")
    if not re.fullmatch(r"[A-Za-z0-9._=+-]+", name):
        raise MoelabError(f"report name {name!r} may hold only letters, digits and . _ = + -")
    return [
        *nsys_profile_argv(trace, osrt, nsys, capture_end),
        f"--output={Path(out_dir) / name}_rank%q{{{rank_var}}}",
    ]


def export_sqlite(rep_path: Path, nsys: str = "nsys", timeout_s: float = 600.0) -> Path:
    """`nsys export --type=sqlite` next to the report; returns the .sqlite path."""
    rep_path = Path(rep_path)
    if not rep_path.exists():
        raise MoelabError(f"no report at {rep_path}")
    path, reason = nsys_available(nsys)
    if path is None:
        raise MoelabError(reason or "nsys is unavailable")
    out = rep_path.with_suffix(".sqlite")
    argv = [path, "export", "--type=sqlite", f"--output={out}", "--force-overwrite=true", str(rep_path)]
    try:
        proc = run_in_session(argv, timeout_s)
    except subprocess.TimeoutExpired:
        raise MoelabError(f"nsys export of {rep_path} took more than {timeout_s:.0f} s") from None
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise MoelabError(
            f"nsys export of {rep_path} failed ({proc.returncode}): {tail[-1] if tail else 'no output'}"
        )
    check_sqlite_export(out)
    return out


def check_sqlite_export(path: Path) -> None:
    """A file nsys's export wrote is an SQLite database with tables, or one MoelabError line: a garbage
    report (or a broken nsys) left a file that was registered as a trace and failed only when read."""
    with contextlib.suppress(OSError), path.open("rb") as fh:
        if fh.read(16) == b"SQLite format 3\x00":
            try:
                con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                try:
                    if _tables(con):
                        return
                finally:
                    con.close()
            except sqlite3.Error:
                pass
    raise MoelabError(
        f"{path} is not an SQLite export with tables (a garbage report, or a broken nsys): not registered"
    )


# The first bytes of an .nsys-rep: every report read here (nsys 2024.x, on x86 and on Tegra) opens with them
REPORT_HEADER = b"NVIDIA Tegra Profiler Report"


def check_report(path: Path) -> None:
    """A report nsys wrote opens with its header, or one MoelabError line: a file that only bears the name
    (a garbage or truncated report, or a broken nsys) was registered as a trace and failed when read."""
    with contextlib.suppress(OSError), path.open("rb") as fh:
        if fh.read(len(REPORT_HEADER)) == REPORT_HEADER:
            return
    raise MoelabError(f"{path} is not an nsys report (it lacks the header nsys writes): not registered")


def path_outside(rel: object) -> str | None:
    """Why a trace path a run directory registers does not name a file inside it (absolute, or climbing out
    with `..`), or None. Said of a path alone: a trace of another node's rank is on that node's disk."""
    if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
        return f"trace {rel!r} is not a path inside the run directory: not registered"
    return None


def trace_problem(run_dir: Path, kind: object, rel: object) -> str | None:
    """Why a trace a run directory registers (nsys_traces.json) is not what its kind says, or None: it must
    be a regular file inside the run directory, a report with nsys's header or an SQLite export with tables.
    `moelab ingest` asks this of a directory it did not write, as the run asks it of what nsys left."""
    outside = path_outside(rel)
    if outside is not None:
        return outside
    path = run_dir / str(rel)
    linked = [p for p in (path, *path.parents) if p.is_symlink() and run_dir in p.parents]
    if linked:  # the file, or a folder of the run directory on its way (a traces folder linked elsewhere)
        return f"trace {path}: {linked[-1]} is a symbolic link: not registered"
    if not path.is_file():
        return f"trace {path} is not a regular file: not registered"
    try:
        if kind == "nsys":
            check_report(path)
        elif kind == "nsys-sqlite":
            check_sqlite_export(path)
    except MoelabError as exc:
        return str(exc)
    return None


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _pid(global_id: int | None) -> int | None:
    return None if global_id is None else (int(global_id) // 0x1000000) % 0x1000000


@dataclass
class _Export:
    """The rows of an nsys SQLite export that attribution needs."""

    strings: dict[int, str]
    nvtx: list[tuple[int, int, int, str | None, int | None, int | None]]
    kernels: dict[tuple[int | None, int], list[tuple[int, int, str]]] = field(default_factory=dict)
    kernel_rows: list[tuple[int, int, int | None, str]] = field(default_factory=list)
    launches: list[tuple[int, int | None, int | None, int]] = field(default_factory=list)
    has_kernels: bool = False


def read_nsys_sqlite(path: Path, prefix: str = PREFIX, name_column: str = "shortName") -> TraceSummary:
    """Per NVTX range whose name starts with `prefix`: API time (the range's span), kernel-only time and
    kernel shares, from an `nsys export --type sqlite` database."""
    if name_column not in NAME_COLUMNS:
        raise MoelabError(f"kernel name column must be one of {', '.join(NAME_COLUMNS)}")
    path = Path(path)
    if not path.exists():
        raise MoelabError(f"no SQLite export at {path}")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = _tables(con)
    except sqlite3.DatabaseError as exc:
        raise MoelabError(f"{path} is not an SQLite database: {exc}") from exc
    try:
        if "NVTX_EVENTS" not in tables:
            raise MoelabError(f"{path} has no NVTX_EVENTS table: profile with --trace including nvtx")
        export = _read_export(con, tables, name_column)
    except sqlite3.DatabaseError as exc:
        raise MoelabError(f"cannot read {path} as an nsys export: {exc}") from exc
    finally:
        con.close()
    m = re.search(r"_rank(\d+)", path.name)
    return TraceSummary(
        source=str(path),
        format="nsys-sqlite",
        attribution="correlation" if export.launches else "gpu-overlap",
        rank=int(m.group(1)) if m else None,
        world_size=None,
        ranges=summarize_instances(_ranges(export, prefix), "kernel"),
        metadata={"kernel_table": export.has_kernels, "name_column": name_column},
    )


def _read_export(con: sqlite3.Connection, tables: set[str], name_column: str) -> _Export:
    strings = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
    text_id = "textId" if "textId" in _columns(con, "NVTX_EVENTS") else "NULL"
    export = _Export(
        strings=strings,
        nvtx=con.execute(
            f'SELECT start, "end", eventType, text, {text_id}, globalTid FROM NVTX_EVENTS '
            f'WHERE eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) AND "end" IS NOT NULL ORDER BY start'
        ).fetchall(),
        has_kernels="CUPTI_ACTIVITY_KIND_KERNEL" in tables,
    )
    if export.has_kernels:
        for start, end, corr, gpid, name_id in con.execute(
            f'SELECT start, "end", correlationId, globalPid, {name_column} FROM CUPTI_ACTIVITY_KIND_KERNEL'
        ):
            name = strings.get(name_id, str(name_id))
            export.kernels.setdefault((_pid(gpid), corr), []).append((start, end, name))
            export.kernel_rows.append((start, end, _pid(gpid), name))
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        export.launches = [
            (start, gtid, _pid(gtid), corr)
            for start, gtid, corr in con.execute(
                "SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start"
            )
        ]
    return export


def _ranges(export: _Export, prefix: str) -> list[RangeInstance]:
    """Each moelab range with its kernels: those launched inside it (by correlation id, from the range's
    thread for push/pop ranges, its process for start/end ones), else those of its process that start
    inside it on the GPU."""
    launch_starts = [x[0] for x in export.launches]
    instances: list[RangeInstance] = []
    for start, end, event_type, text, tid, gtid in export.nvtx:
        name = text if text is not None else export.strings.get(tid) if tid is not None else None
        if name is None or not str(name).startswith(prefix):
            continue
        inst = RangeInstance(name=str(name), start_us=start / NS_PER_US, end_us=end / NS_PER_US)
        pid = _pid(gtid)
        if export.launches:
            lo, hi = bisect.bisect_left(launch_starts, start), bisect.bisect_right(launch_starts, end)
            for _, l_gtid, l_pid, corr in export.launches[lo:hi]:
                same = l_gtid == gtid if event_type == NVTX_PUSH_POP else l_pid == pid
                if not same:
                    continue
                for ks, ke, kname in export.kernels.get((l_pid, corr), []):
                    inst.events.append(Event(name=kname, start_us=ks / NS_PER_US, end_us=ke / NS_PER_US))
        else:
            for ks, ke, kpid, kname in export.kernel_rows:
                if kpid == pid and start <= ks <= end:
                    inst.events.append(Event(name=kname, start_us=ks / NS_PER_US, end_us=ke / NS_PER_US))
        instances.append(inst)
    return instances


def report_paths(out_dir: Path, name: str) -> dict[int, Path]:
    """The per-rank reports `nsys_prefix_argv(out_dir, name, …)` produced, by rank."""
    found = {}
    for p in Path(out_dir).glob(f"{name}_rank*.nsys-rep"):
        m = re.fullmatch(rf"{re.escape(name)}_rank(\d+)\.nsys-rep", p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def _trace_row(files: JobFiles, rank: int, kind: str, path: Path) -> dict[str, object]:
    return {
        "rank": rank,
        "kind": kind,
        "path": str(path.relative_to(files.run_dir)),
        "size_bytes": path.stat().st_size,
    }


def collect_reports(files: JobFiles, world: int | None = None) -> str | None:
    """After an nsys job: register each rank's report and its SQLite export for ingest
    (JobFiles.write_nsys_traces), and return what went wrong in one line (None when every rank left a
    report that exported). The nsys inside Nsight Compute on this workplace's GPU machines records
    .qdstrm files but its importer fails, so a run "with" nsys traces can have none: that must be said."""
    found: list[dict[str, object]] = []
    failed: list[str] = []
    reports = report_paths(files.traces_dir, files.backend)
    for rank, rep in reports.items():
        try:
            check_report(rep)
        except MoelabError as exc:  # nothing to export: a garbage report is said, never registered
            failed.append(str(exc))
            continue
        found.append(_trace_row(files, rank, "nsys", rep))
        try:
            sqlite = export_sqlite(rep)
        except MoelabError as exc:  # keep the report even when the export fails
            failed.append(str(exc))
            continue
        found.append(_trace_row(files, rank, "nsys-sqlite", sqlite))
    note = None
    if not reports:
        left = sorted(p.name for p in files.traces_dir.glob("*")) if files.traces_dir.exists() else []
        note = "nsys wrote no .nsys-rep report" + (f"; it left only {', '.join(left[:5])}" if left else "")
        if any(name.endswith(".qdstrm") for name in left):
            note += " (its QdstrmImporter could not turn the recording into a report)"
    elif world is not None and len(reports) < world:
        missing = sorted(set(range(world)) - set(reports))
        note = f"nsys wrote no report for rank(s) {', '.join(map(str, missing))}"
    if failed:  # the reports stay registered where their export is what failed
        note = "; ".join(
            [*([note] if note else []), *dict.fromkeys(f"SQLite export failed: {f}" for f in failed)]
        )
    files.write_nsys_traces(found, note)
    return note
