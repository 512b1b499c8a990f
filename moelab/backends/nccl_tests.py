"""The nccl-tests baseline: run the user's `alltoall_perf` and read its results into typed rows.

Formats follow NVIDIA/nccl-tests src/util.cu (checked at NCCL_TESTS_VERSION 2.19.6):
- text: a header "#  size  count  type  redop  root  time algbw busbw #wrong  time algbw busbw #wrong",
  rows "%12li %12li %8s %6s %6i" then, per out-of-place and in-place, "%7s %6s %6s %6g" (or "N/A" for
  #wrong when the test does not check: alltoall's in-place), optional per-iteration columns (-I 1:
  i_min i_max i_p99 i_cv%) and a timestamp (-S 1); then "# Out of bounds values : N OK|FAILED" and
  "# Avg bus bandwidth : X". Failures print "<host>: Test NCCL failure <file>:<line> '<msg>'" (also
  CUDA), often on the same line as a row's preamble, and " .. <host> pid N: Test failure <file>:<line>".
- JSON (-J file.json, since 2.17.x): {"version", "nccl_version", "config", "results": [{"size",
  "count", "type", "redop", "root" (a string), "out_of_place": {"time"|"cpu_time", "alg_bw",
  "bus_bw", "nwrong"}|null, "in_place": {...}}], "out_of_bounds": {"count", "okay"},
  "average_bus_bandwidth": {"bandwidth", ...}, "errors": [...]}. Version 1 spelled the average
  "average_bus_bandwidith"/"bandwidith"; booleans are written as the strings "true"/"false", NaN as "nan".
Sizes are bytes per rank over all peers; busbw = algbw x (n-1)/n.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moelab.core.errors import BackendUnavailable, MoelabError

BINARY = "alltoall_perf"
BACKEND = "nccl-tests"  # the backend that runs it (moelab.backends.nccl_tests_job)

_FAILURE = re.compile(r"(?P<host>\S+): Test (?P<kind>NCCL|CUDA) failure (?P<where>\S+) (?P<msg>.*)$")
_TEST_FAILURE = re.compile(r"\.\. (?P<host>\S+) pid \d+: Test failure (?P<where>\S+)")
_VERSION = re.compile(r"^# nccl-tests version (\S+) nccl-headers=(\d+) nccl-library=(\d+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_ERROR = re.compile(r"^# error: (.*)$")


@dataclass(frozen=True, kw_only=True, slots=True)
class AlltoallRow:
    """One size; columns map one to one onto the store's nccl-tests rows."""

    size_bytes: int  # per rank, over all peers
    count: int  # elements per peer
    dtype: str
    redop: str
    root: int
    time_us_oop: float | None
    algbw_gbps_oop: float | None
    busbw_gbps_oop: float | None
    wrong_oop: int | None  # None: not checked
    time_us_ip: float | None
    algbw_gbps_ip: float | None
    busbw_gbps_ip: float | None
    wrong_ip: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclTestsResult:
    rows: tuple[AlltoallRow, ...]
    avg_busbw_gbps: float | None
    out_of_bounds: int | None
    source: str  # "json" or "text"
    status: (
        str  # ok | wrong | nccl_failure | cuda_failure | test_failure | truncated | no_results | exit_code
    )
    problems: tuple[str, ...] = ()
    nccl_tests_version: str | None = None
    nccl_version: int | None = None
    returncode: int | None = None
    argv: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class AlltoallPerfRun:
    """One invocation of alltoall_perf: the results of each size."""

    binary: str
    results: tuple[NcclTestsResult, ...]
    json_output: bool
    env: Mapping[str, str] = field(default_factory=dict)


# --- parsing ------------------------------------------------------------------------------------------


def _num(text: str) -> float | None:
    if text in ("N/A", "nan", "-nan", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _wrong(text: str) -> int | None:
    value = _num(text)
    return None if value is None else int(value)


def _status(rows: Sequence[AlltoallRow], oob: int | None, problems: list[str], complete: bool) -> str:
    if any(p.startswith("NCCL failure") for p in problems):
        return "nccl_failure"
    if any(p.startswith("CUDA failure") for p in problems):
        return "cuda_failure"
    if any(p.startswith("test failure") for p in problems):
        return "test_failure"
    if not rows:
        return "no_results"
    if not complete:
        return "truncated"
    if (oob or 0) > 0 or any((r.wrong_oop or 0) > 0 or (r.wrong_ip or 0) > 0 for r in rows):
        return "wrong"
    return "ok"


@dataclass
class _TextParse:
    """What parse_text has read so far."""

    rows: list[AlltoallRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    version: str | None = None
    nccl_version: int | None = None
    avg: float | None = None
    oob: int | None = None
    group: int = 4  # columns per out-of-place / in-place group (8 with per-iteration columns)


def parse_text(text: str) -> NcclTestsResult:
    """Parse alltoall_perf's stdout. Tolerates per-iteration and timestamp columns and a cut-off table."""
    st = _TextParse()
    for raw in text.splitlines():
        line = raw.rstrip()
        if _read_failure(line, st) or _read_summary_line(line, st):
            continue
        words = line.split()
        if not words or not words[0].isdigit():
            continue
        if len(words) < 5 + 2 * st.group:
            st.problems.append(f"row for size {words[0]} cut off")
            continue
        st.rows.append(_row(words, st.group))
    complete = st.avg is not None and not any(p.endswith("cut off") for p in st.problems)
    return NcclTestsResult(
        rows=tuple(st.rows),
        avg_busbw_gbps=st.avg,
        out_of_bounds=st.oob,
        source="text",
        status=_status(st.rows, st.oob, st.problems, complete),
        problems=tuple(st.problems),
        nccl_tests_version=st.version,
        nccl_version=st.nccl_version,
    )


def _read_failure(line: str, st: _TextParse) -> bool:
    """A CUDA/NCCL failure line or a test failure: recorded as a problem."""
    failure = _FAILURE.search(line)
    if failure:
        host, prefix = failure["host"], line[: failure.start()].split()
        if len(prefix) == 4 and prefix[0].isdigit():
            # printed right after a row's preamble, glued to its root column ("-1host: Test ...")
            glued = re.match(r"^(-?\d+)(.+)$", host)
            host = glued.group(2) if glued else host
            st.problems.append(f"row for size {prefix[0]} cut off")
        st.problems.insert(
            len(st.problems) - (1 if prefix else 0),
            f"{failure['kind']} failure at {failure['where']} on {host}: {failure['msg']}",
        )
        return True
    tf = _TEST_FAILURE.search(line)
    if tf:
        st.problems.append(f"test failure at {tf['where']} on {tf['host']}")
        return True
    return False


def _read_summary_line(line: str, st: _TextParse) -> bool:
    """The version, average bus bandwidth, out-of-bounds count, error and comment lines."""
    if m := _VERSION.match(line):
        st.version, st.nccl_version = m.group(1), int(m.group(3))
    elif m := _AVG.match(line):
        st.avg = _num(m.group(1))
    elif m := _OOB.match(line):
        st.oob = int(m.group(1))
    elif m := _ERROR.match(line):
        st.problems.append(f"error: {m.group(1)}")
    elif line.startswith("#"):
        if "size" in line.split() and "i_min" in line:
            st.group = 8
    else:
        return False
    return True


def _row(words: list[str], group: int) -> AlltoallRow:
    oop, ip = words[5 : 5 + group], words[5 + group : 5 + 2 * group]
    return AlltoallRow(
        size_bytes=int(words[0]),
        count=int(words[1]),
        dtype=words[2],
        redop=words[3],
        root=int(words[4]),
        time_us_oop=_num(oop[0]),
        algbw_gbps_oop=_num(oop[1]),
        busbw_gbps_oop=_num(oop[2]),
        wrong_oop=_wrong(oop[3]),
        time_us_ip=_num(ip[0]),
        algbw_gbps_ip=_num(ip[1]),
        busbw_gbps_ip=_num(ip[2]),
        wrong_ip=_wrong(ip[3]),
    )


def _json_num(value: Any) -> float | None:
    if value is None or isinstance(value, str):
        return None  # null, or "nan"
    return float(value)


def _json_group(group: Any) -> tuple[float | None, float | None, float | None, int | None]:
    if not isinstance(group, dict):
        return None, None, None, None
    time_us = _json_num(group.get("time", group.get("cpu_time")))
    wrong = _json_num(group.get("nwrong"))
    return (
        time_us,
        _json_num(group.get("alg_bw")),
        _json_num(group.get("bus_bw")),
        None if wrong is None else int(wrong),
    )


def parse_json(text: str) -> NcclTestsResult:
    """Parse the -J output file. Raises MoelabError when it is not a complete nccl-tests JSON document."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise MoelabError(
            f"nccl-tests JSON output is not valid JSON ({e.msg}): the run was probably cut off"
        ) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise MoelabError("nccl-tests JSON output has no results list")
    rows = []
    for r in doc["results"]:
        t_o, a_o, b_o, w_o = _json_group(r.get("out_of_place"))
        t_i, a_i, b_i, w_i = _json_group(r.get("in_place"))
        rows.append(
            AlltoallRow(
                size_bytes=int(r["size"]),
                count=int(r["count"]),
                dtype=str(r["type"]),
                redop=str(r["redop"]),
                root=int(str(r["root"]).strip()),
                time_us_oop=t_o,
                algbw_gbps_oop=a_o,
                busbw_gbps_oop=b_o,
                wrong_oop=w_o,
                time_us_ip=t_i,
                algbw_gbps_ip=a_i,
                busbw_gbps_ip=b_i,
                wrong_ip=w_i,
            )
        )
    avg_obj = doc.get("average_bus_bandwidth", doc.get("average_bus_bandwidith"))
    avg = None
    if isinstance(avg_obj, dict):
        avg = _json_num(avg_obj.get("bandwidth", avg_obj.get("bandwidith")))
    oob_obj = doc.get("out_of_bounds")
    oob = int(oob_obj["count"]) if isinstance(oob_obj, dict) and "count" in oob_obj else None
    problems = [f"error: {e}" for e in doc.get("errors") or [] if e]
    nccl_version = doc.get("nccl_version")
    return NcclTestsResult(
        rows=tuple(rows),
        avg_busbw_gbps=avg,
        out_of_bounds=oob,
        source="json",
        status=_status(rows, oob, problems, complete=avg_obj is not None),
        problems=tuple(problems),
        nccl_version=int(nccl_version) if isinstance(nccl_version, int) else None,
    )


# --- running ------------------------------------------------------------------------------------------


def find_alltoall_perf(path: str | os.PathLike[str] | None = None, search_path: str | None = None) -> Path:
    """The binary from `path` (--nccl-tests-bin: the file or its directory), else from PATH."""
    if path is not None:
        p = Path(path)
        if p.is_dir():
            p = p / BINARY
        if not p.is_file() or not os.access(p, os.X_OK):
            raise BackendUnavailable(
                f"{p} is not an executable alltoall_perf (build nccl-tests, then --nccl-tests-bin)"
            )
        return p
    found = shutil.which(BINARY, path=search_path)
    if found is None:
        raise BackendUnavailable(
            "alltoall_perf not found on PATH: build nccl-tests and pass --nccl-tests-bin"
        )
    return Path(found)


def supports_json(binary: Path, timeout_s: float = 30.0) -> bool:
    """True when `alltoall_perf --help` lists -J (nccl-tests 2.17+). --help exits before MPI or CUDA start."""
    try:
        done = subprocess.run(
            [str(binary), "--help"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return bool(re.search(r"-J,\s*--output_file", done.stdout + done.stderr))


def alltoall_perf_argv(
    binary: Path,
    size_bytes: int,
    *,
    gpus: int,
    iters: int,
    warmup: int,
    dtype: str = "bfloat16",
    json_path: Path | None = None,
    prefix: Sequence[str] = (),
) -> list[str]:
    """One size: -b = -e = size. `prefix`: a launcher (mpirun ...) for more than one process."""
    argv = [*prefix, str(binary), "-b", str(size_bytes), "-e", str(size_bytes), "-f", "2"]
    argv += ["-g", str(gpus), "-d", dtype, "-n", str(iters), "-w", str(warmup)]
    if json_path is not None:
        argv += ["-J", str(json_path)]
    return argv


def aligned_size(size_bytes: int, ranks: int, elem_bytes: int = 2) -> int:
    """The nearest size >= `size_bytes` that alltoall_perf runs as given: it truncates the per-peer
    count to a multiple of 16 bytes, so a size that is not a multiple of ranks x 16 would be reported smaller."""
    unit = ranks * max(16, elem_bytes)
    return max(unit, -(-size_bytes // unit) * unit)


def run_alltoall_perf(
    sizes: Sequence[int],
    *,
    binary: str | os.PathLike[str] | None = None,
    gpus: int,
    iters: int = 20,
    warmup: int = 5,
    dtype: str = "bfloat16",
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
    workdir: Path | None = None,
) -> AlltoallPerfRun:
    """Run alltoall_perf once per size; each result from its JSON file when the binary writes one and it
    parses, else from the text table. A timeout or crash gives a result with its status, not an exception."""
    exe = find_alltoall_perf(binary)
    use_json = supports_json(exe)
    results = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for i, size in enumerate(sizes):
            json_path = Path(tmp) / f"alltoall_{i}.json" if use_json else None
            argv = alltoall_perf_argv(
                exe,
                size,
                gpus=gpus,
                iters=iters,
                warmup=warmup,
                dtype=dtype,
                json_path=json_path,
                prefix=prefix,
            )
            results.append(_run_one(argv, json_path, {**os.environ, **(env or {})}, timeout_s))
    return AlltoallPerfRun(binary=str(exe), results=tuple(results), json_output=use_json, env=dict(env or {}))


def _run_one(
    argv: list[str], json_path: Path | None, env: dict[str, str], timeout_s: float
) -> NcclTestsResult:
    """One size's run: its result with the exit code and argv; a timeout is a truncated result, a non-zero
    exit after a clean table is `exit_code`."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL
        )
        stdout, rc, extra = done.stdout + done.stderr, done.returncode, []
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        stdout, rc, extra = out, None, [f"timed out after {timeout_s:.0f} s"]
    result = _pick(stdout, json_path)
    status = result.status
    if rc is None:
        status = "truncated" if status == "ok" else status
    elif rc != 0 and status == "ok":
        status = "exit_code"
        extra.append(f"exit code {rc}")
    return NcclTestsResult(
        **{
            **_fields(result),
            "status": status,
            "problems": (*result.problems, *extra),
            "returncode": rc,
            "argv": tuple(argv),
        }
    )


def _fields(result: NcclTestsResult) -> dict[str, Any]:
    return {f: getattr(result, f) for f in NcclTestsResult.__dataclass_fields__}


def _pick(stdout: str, json_path: Path | None) -> NcclTestsResult:
    text_result = parse_text(stdout)
    if json_path is not None and json_path.exists():
        try:
            from_json = parse_json(json_path.read_text())
        except MoelabError:
            return text_result
        if from_json.rows:
            # the JSON has no version line; the text does
            return NcclTestsResult(
                **{**_fields(from_json), "nccl_tests_version": text_result.nccl_tests_version}
            )
    return text_result
