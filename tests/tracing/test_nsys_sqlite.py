"""The nsys side: the per-rank command line (golden, per launcher), nsys discovery and export, and the
SQLite reader.

The database is built here from the documented `nsys export --type sqlite` table layout (Nsight Systems
"SQLite Export Schema Reference": StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_RUNTIME,
CUPTI_ACTIVITY_KIND_KERNEL; times in ns; eventType 59 = NvtxPushPopRange, 60 = NvtxStartEndRange,
34 = NvtxMark; globalTid = PID * 0x1000000 + TID), not recorded from a real nsys run (none runs here).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

from moelab.core.errors import MoelabError
from moelab.job.launchers import LaunchPlan, torchrun_local_argv
from moelab.tracing.kernel_time import op_kernel_times
from moelab.tracing.nsys import (
    export_sqlite,
    nsys_available,
    nsys_prefix_argv,
    nsys_profile_argv,
    rank_var_for,
    read_nsys_sqlite,
    report_paths,
)
from moelab.tracing.wrap import splice_rank_wrapper

PID = 4242
TID_MAIN, TID_OTHER = 4242, 4250


def gtid(tid: int, pid: int = PID) -> int:
    return pid * 0x1000000 + tid


SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
  textId INTEGER REFERENCES StringIds(id), domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,
  doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL REFERENCES StringIds(id),
  returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL REFERENCES StringIds(id), shortName INTEGER NOT NULL REFERENCES StringIds(id),
  mangledName INTEGER REFERENCES StringIds(id), gridX INTEGER, gridY INTEGER, gridZ INTEGER,
  blockX INTEGER, blockY INTEGER, blockZ INTEGER);
"""

STRINGS = {
    1: "cudaLaunchKernel",
    2: "ncclDevKernel_AllToAll",
    3: "ncclDevKernel_AllToAll(ncclDevKernelArgs)",
    4: "combine_kernel",
    5: "void combine_kernel<bf16>(...)",
    6: "moelab/deepep/combine/c",  # registered NVTX string (textId)
    7: "stray",
    8: "stray(void)",
}


def build_db(path: Path, with_runtime: bool = True) -> Path:
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(STRINGS.items()))
    con.executemany(
        "INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
        [
            (34, "NvtxMark", "NVTX Mark"),
            (59, "NvtxPushPopRange", "NVTX PushPop Range"),
            (60, "NvtxStartEndRange", "NVTX StartEnd Range"),
        ],
    )
    nvtx = [
        # dispatch: two push/pop instances on the main thread, text given inline
        (1_000, 2_000, 59, "moelab/deepep/dispatch/c", None, gtid(TID_MAIN)),
        (5_000, 6_000, 59, "moelab/deepep/dispatch/c", None, gtid(TID_MAIN)),
        # combine: a registered string (text NULL, textId set)
        (8_000, 9_000, 59, None, 6, gtid(TID_MAIN)),
        # a mark and an unrelated range: ignored
        (1_500, 1_500, 34, "moelab/deepep/dispatch/c", None, gtid(TID_MAIN)),
        (1_000, 9_500, 59, "ProfilerStep", None, gtid(TID_MAIN)),
    ]
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId, globalTid) VALUES (?, ?, ?, ?, ?, ?)",
        nvtx,
    )
    runtime = [
        (1_100, 1_200, gtid(TID_MAIN), 101),  # dispatch #1, kernel on stream 7
        (1_300, 1_400, gtid(TID_MAIN), 102),  # dispatch #1, second kernel overlapping on stream 8
        (1_500, 1_600, gtid(TID_OTHER), 103),  # another thread inside the time window: not dispatch's
        (5_100, 5_200, gtid(TID_MAIN), 104),  # dispatch #2
        (8_100, 8_200, gtid(TID_MAIN), 105),  # combine
    ]
    if with_runtime:
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue) VALUES (?, ?, 1, ?, ?, 1, 0)",
            runtime,
        )
    kernels = [
        # start, end, stream, correlation, shortName, demangledName
        (3_000, 4_000, 7, 101, 2, 3),
        (3_500, 4_500, 8, 102, 2, 3),
        (10_000, 10_100, 9, 103, 7, 8),
        (5_500, 6_300, 7, 104, 2, 3),
        (8_500, 8_900, 7, 105, 4, 5),
    ]
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, globalPid, shortName, demangledName) VALUES (?, ?, 0, 1, ?, ?, ?, ?, ?)",
        [(s, e, st, c, gtid(0), sn, dn) for s, e, st, c, sn, dn in kernels],
    )
    con.commit()
    con.close()
    return path


def test_reader_attributes_kernels_by_launch_correlation(tmp_path: Path) -> None:
    s = read_nsys_sqlite(build_db(tmp_path / "deepep_rank1.sqlite"))
    assert (s.format, s.attribution, s.rank) == ("nsys-sqlite", "correlation", 1)
    assert [r.name for r in s.ranges] == ["moelab/deepep/dispatch/c", "moelab/deepep/combine/c"]
    d = s.get("moelab/deepep/dispatch/c")
    assert d is not None and d.count == 2 and d.event_kind == "kernel"
    assert d.api_us_total == pytest.approx(2.0)  # two 1 us ranges
    # instance 1: kernels [3.0, 4.0] and [3.5, 4.5] us → union 1.5, sum 2.0; instance 2: 0.8
    assert d.kernel_us_total == pytest.approx(1.5 + 0.8)
    assert d.kernel_sum_us_total == pytest.approx(2.0 + 0.8)
    assert [(k.name, k.count) for k in d.kernels] == [("ncclDevKernel_AllToAll", 3)]
    assert d.kernels[0].share == pytest.approx(1.0)
    c = s.get("moelab/deepep/combine/c")
    assert c is not None and c.kernel_us_total == pytest.approx(0.4)
    assert [k.name for k in c.kernels] == ["combine_kernel"]
    assert "stray" not in {k.name for r in s.ranges for k in r.kernels}
    times = op_kernel_times(s, "deepep", "c")
    assert times["dispatch"].calls == 2 and times["dispatch"].kernel_us == pytest.approx(1.15)
    assert set(times) == {"dispatch", "combine"}


def test_reader_demangled_names_and_all_ranges(tmp_path: Path) -> None:
    db = build_db(tmp_path / "x.sqlite")
    s = read_nsys_sqlite(db, name_column="demangledName")
    c = s.get("moelab/deepep/combine/c")
    assert c is not None and c.kernels[0].name == "void combine_kernel<bf16>(...)"
    assert s.rank is None
    everything = read_nsys_sqlite(db, prefix="")
    step = everything.get("ProfilerStep")
    assert step is not None and step.count == 1
    # the enclosing range holds every main-thread launch, not the other thread's
    assert {k.name: k.count for k in step.kernels} == {"ncclDevKernel_AllToAll": 3, "combine_kernel": 1}


def test_reader_falls_back_to_gpu_overlap_without_runtime_table(tmp_path: Path) -> None:
    s = read_nsys_sqlite(build_db(tmp_path / "r.sqlite", with_runtime=False))
    assert s.attribution == "gpu-overlap"
    d = s.get("moelab/deepep/dispatch/c")
    # only kernels that started inside a range: [5.5, 6.3] in instance 2; instance 1's ran after it
    assert d is not None and d.kernel_us_total == pytest.approx(0.8)


def test_reader_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(MoelabError, match="no SQLite export"):
        read_nsys_sqlite(tmp_path / "missing.sqlite")
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(MoelabError, match="NVTX_EVENTS"):
        read_nsys_sqlite(empty)
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database at all, just text" * 20)
    with pytest.raises(MoelabError):
        read_nsys_sqlite(junk)


NSYS_FLAGS = [
    "--trace=cuda,nvtx",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--sample=none",
    "--cpuctxsw=none",
    "--force-overwrite=true",
]


@pytest.mark.parametrize(
    ("launcher", "var"), [("local", "RANK"), ("slurm", "SLURM_PROCID"), ("mpirun", "OMPI_COMM_WORLD_RANK")]
)
def test_nsys_prefix_golden_per_launcher(launcher: str, var: str) -> None:
    argv = nsys_prefix_argv("/runs/r1/deepep/traces", "deepep", rank_var=rank_var_for(launcher))
    assert argv == [
        "nsys",
        "profile",
        *NSYS_FLAGS,
        f"--output=/runs/r1/deepep/traces/deepep_rank%q{{{var}}}",
    ]
    assert nsys_profile_argv() == ["nsys", "profile", *NSYS_FLAGS]


def test_nsys_prefix_options() -> None:
    argv = nsys_prefix_argv(
        "/o", "n", trace="cuda,nvtx", osrt=True, nsys="/opt/nsys/bin/nsys", capture_end="repeat"
    )
    assert argv[0] == "/opt/nsys/bin/nsys"
    assert "--trace=cuda,nvtx,osrt" in argv and "--capture-range-end=repeat" in argv
    with pytest.raises(MoelabError):
        nsys_prefix_argv("/o", "n", rank_var="LOCAL_RANK")
    with pytest.raises(MoelabError):
        nsys_prefix_argv("/o", "bad name")
    with pytest.raises(MoelabError):
        rank_var_for("pbs")


def test_splice_into_torchrun_srun_mpirun_golden() -> None:
    py = sys.executable
    prefix = nsys_prefix_argv("/t", "nccl-a2a")
    tr = torchrun_local_argv(
        LaunchPlan(python=py, gpus_per_node=2, device="cpu", worker_args=("/runs/r1", "nccl-a2a"))
    )
    i = tr.index("-m", 3)  # torchrun's own --module flag
    assert splice_rank_wrapper(tr, prefix, python=py) == (
        tr[:i] + ["--no-python", *prefix, py, "-m", "moelab.measure.worker", "/runs/r1", "nccl-a2a"]
    )
    srun = ["srun", "--ntasks=4", py, "-m", "moelab.measure.worker", "/runs/r1", "deepep"]
    sprefix = nsys_prefix_argv("/t", "deepep", rank_var="SLURM_PROCID")
    assert splice_rank_wrapper(srun, sprefix, python=py) == [
        "srun",
        "--ntasks=4",
        *sprefix,
        py,
        "-m",
        "moelab.measure.worker",
        "/runs/r1",
        "deepep",
    ]
    mpi = ["mpirun", "-np", "2", "python3", "-m", "moelab.measure.worker", "/runs/r1", "deepep"]
    mprefix = nsys_prefix_argv("/t", "deepep", rank_var="OMPI_COMM_WORLD_RANK")
    assert splice_rank_wrapper(mpi, mprefix) == [
        "mpirun",
        "-np",
        "2",
        *mprefix,
        "python3",
        "-m",
        "moelab.measure.worker",
        "/runs/r1",
        "deepep",
    ]
    assert splice_rank_wrapper(mpi, []) == mpi
    with pytest.raises(ValueError):
        splice_rank_wrapper(["torchrun", "train.py"], prefix)


def _fake_tool(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def test_nsys_discovery_reasons(tmp_path: Path) -> None:
    path, reason = nsys_available(str(tmp_path / "no-such-nsys"))
    assert path is None and reason is not None and "not found" in reason
    partial = _fake_tool(tmp_path / "ncu" / "target", "nsys", 'echo "NVIDIA Nsight Systems version 2025.1"\n')
    path, reason = nsys_available(str(partial))
    assert path is None and reason is not None and "QdstrmImporter" in reason
    broken = _fake_tool(tmp_path / "broken", "nsys", "echo 'libfoo missing' >&2; exit 3\n")
    path, reason = nsys_available(str(broken))
    assert path is None and reason is not None and "exited 3" in reason


def test_export_sqlite_runs_nsys_export(tmp_path: Path) -> None:
    root = tmp_path / "nsight-systems"
    _fake_tool(root / "host-linux-x64", "QdstrmImporter", "exit 0\n")
    nsys = _fake_tool(
        root / "target-linux-x64",
        "nsys",
        'if [ "$1" = "--version" ]; then echo 2025.1; exit 0; fi\n'
        'for a in "$@"; do case "$a" in --output=*) out="${a#--output=}";; esac; done\n'
        'echo "$@" > "$out.args"; '
        f'{sys.executable} -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute(\'CREATE TABLE StringIds (id INTEGER)\')" "$out"\n',
    )
    assert nsys_available(str(nsys)) == (str(nsys), None)
    rep = tmp_path / "traces" / "deepep_rank0.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"rep")
    (tmp_path / "traces" / "deepep_rank1.nsys-rep").write_bytes(b"rep")
    out = export_sqlite(rep, nsys=str(nsys))
    assert out == rep.with_suffix(".sqlite") and out.exists()
    args = Path(str(out) + ".args").read_text().split()
    assert args == ["export", "--type=sqlite", f"--output={out}", "--force-overwrite=true", str(rep)]
    assert [p.name for p in report_paths(tmp_path / "traces", "deepep").values()] == [
        "deepep_rank0.nsys-rep",
        "deepep_rank1.nsys-rep",
    ]
    with pytest.raises(MoelabError, match="no report"):
        export_sqlite(tmp_path / "missing.nsys-rep", nsys=str(nsys))


def test_a_garbage_export_is_not_registered(tmp_path: Path) -> None:
    """An nsys that exits 0 but leaves garbage where the SQLite export should be (issue 41): refused in one
    line, so collect_reports does not register it as a trace."""
    root = tmp_path / "ns"
    _fake_tool(root, "QdstrmImporter", "exit 0\n")
    nsys = _fake_tool(
        root,
        "nsys",
        'if [ "$1" = "--version" ]; then exit 0; fi\n'
        'for a in "$@"; do case "$a" in --output=*) out="${a#--output=}";; esac; done\n'
        'head -c 5000 /dev/urandom > "$out"\n',
    )
    rep = tmp_path / "a.nsys-rep"
    rep.write_bytes(b"garbage report")
    with pytest.raises(MoelabError, match="is not an SQLite export with tables"):
        export_sqlite(rep, nsys=str(nsys))


@pytest.mark.skipif(os.name != "posix", reason="shell scripts stand in for nsys")
def test_export_failure_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    _fake_tool(root, "QdstrmImporter", "exit 0\n")
    nsys = _fake_tool(
        root, "nsys", 'if [ "$1" = "--version" ]; then exit 0; fi\necho "bad report" >&2; exit 1\n'
    )
    rep = tmp_path / "a.nsys-rep"
    rep.write_bytes(b"x")
    with pytest.raises(MoelabError, match="bad report"):
        export_sqlite(rep, nsys=str(nsys))
