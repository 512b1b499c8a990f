"""Parsing alltoall_perf output (moelab.backends.nccl_tests) from outputs in the formats of nccl-tests' util.cu.

The fixtures follow the printf/JSON writers of NVIDIA/nccl-tests 2.17-2.19 (src/util.cu): rows
"%12li  %12li  %8s  %6s  %6i" + per group "  %7s  %6s  %6s  %6g" (in-place alltoall is not checked: N/A).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from moelab.backends.nccl_tests import (
    aligned_size,
    alltoall_perf_argv,
    find_alltoall_perf,
    parse_json,
    parse_text,
    run_alltoall_perf,
    supports_json,
)
from moelab.core.errors import BackendUnavailable, MoelabError

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "nccl_tests"


def _read(name: str) -> str:
    return (FIX / name).read_text()


def test_text_ok() -> None:
    r = parse_text(_read("text_ok.txt"))
    assert r.status == "ok" and r.ok and r.source == "text"
    assert [row.size_bytes for row in r.rows] == [33554432, 67108864, 134217728, 268435456]
    first = r.rows[0]
    assert (first.count, first.dtype, first.redop, first.root) == (8388608, "bfloat16", "none", -1)
    assert (first.time_us_oop, first.algbw_gbps_oop, first.busbw_gbps_oop, first.wrong_oop) == (
        155.31,
        216.05,
        108.02,
        0,
    )
    assert (first.time_us_ip, first.busbw_gbps_ip, first.wrong_ip) == (155.60, 107.82, None)  # N/A
    assert r.rows[3].time_us_oop == 1052.60
    assert r.avg_busbw_gbps == pytest.approx(119.548)
    assert r.out_of_bounds == 0
    assert (r.nccl_tests_version, r.nccl_version) == ("2.17.6", 22809)
    # busbw = algbw x (n-1)/n with n = 2 ranks, as alltoall.cu defines it
    for row in r.rows:
        assert row.busbw_gbps_oop == pytest.approx(row.algbw_gbps_oop / 2, abs=0.01)


def test_text_wrong_values() -> None:
    r = parse_text(_read("text_wrong.txt"))
    assert r.status == "wrong" and not r.ok
    assert [row.wrong_oop for row in r.rows] == [0, 1024, 0, 0]
    assert r.out_of_bounds == 1


def test_text_nccl_failure_mid_table() -> None:
    r = parse_text(_read("text_nccl_failure.txt"))
    assert r.status == "nccl_failure"
    assert len(r.rows) == 2  # the third size's row was never finished
    assert r.problems[0].startswith("NCCL failure at common.cu:381 on h200-x2: 'unhandled cuda error")
    assert "row for size 134217728 cut off" in r.problems
    assert sum(p.startswith("test failure") for p in r.problems) == 4
    assert r.avg_busbw_gbps is None


def test_text_truncated_table() -> None:
    r = parse_text(_read("text_truncated.txt"))
    assert r.status == "truncated"
    assert len(r.rows) == 2 and r.avg_busbw_gbps is None
    assert "row for size 134217728 cut off" in r.problems


def test_text_empty_and_cuda_failure() -> None:
    assert parse_text("").status == "no_results"
    r = parse_text("node7: Test CUDA failure common.cu:1020 'out of memory'\n")
    assert r.status == "cuda_failure" and r.problems == (
        "CUDA failure at common.cu:1020 on node7: 'out of memory'",
    )


def test_text_with_per_iteration_columns_and_timestamps() -> None:
    header = (
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
        "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%\n"
    )
    row = (
        "     1048576        262144  bfloat16    none      -1    20.10   52.17   26.08       0    19.80    22.00"
        "    21.90     2.10    20.30   51.65   25.83    N/A    19.90    23.00    22.80     2.30 2026-11-22 07:10:02\n"
    )
    r = parse_text(header + row + "# Avg bus bandwidth    : 25.955 \n")
    assert r.status == "ok"
    (only,) = r.rows
    assert (only.time_us_oop, only.wrong_oop, only.time_us_ip, only.busbw_gbps_ip) == (20.10, 0, 20.30, 25.83)


def test_json_v2() -> None:
    r = parse_json(_read("alltoall_v2.json"))
    assert r.status == "ok" and r.source == "json" and r.nccl_version == 22809
    (row,) = r.rows
    assert (row.size_bytes, row.count, row.dtype, row.root) == (134217728, 33554432, "bfloat16", -1)
    assert row.time_us_oop == pytest.approx(540.77)
    assert row.busbw_gbps_oop == pytest.approx(124.0986, abs=1e-3)
    assert (row.wrong_oop, row.wrong_ip) == (0, None)
    assert r.avg_busbw_gbps == pytest.approx(row.busbw_gbps_oop)
    assert r.out_of_bounds == 0


def test_json_v1_misspelled_average() -> None:
    r = parse_json(_read("alltoall_v1.json"))
    assert r.status == "ok" and r.avg_busbw_gbps == pytest.approx(124.0986, abs=1e-3)


def test_json_truncated_is_an_error() -> None:
    with pytest.raises(MoelabError, match="cut off"):
        parse_json(_read("alltoall_truncated.json"))
    with pytest.raises(MoelabError, match="no results"):
        parse_json('{"version": 2}')


def test_json_nan_and_wrong() -> None:
    doc = (
        '{"version":2,"results":[{"size":64,"count":8,"type":"bfloat16","redop":"none","root":"    -1",'
        '"out_of_place":{"time":"nan","alg_bw":0.0,"bus_bw":0.0,"nwrong":3.000000},"in_place":null}],'
        '"out_of_bounds":{"count":1,"okay":"false"},"average_bus_bandwidth":{"bandwidth":0.0,"okay":"unchecked"},'
        '"errors":["remote process exited"]}'
    )
    r = parse_json(doc)
    (row,) = r.rows
    assert row.time_us_oop is None and row.wrong_oop == 3 and row.time_us_ip is None
    assert r.status == "wrong" and r.problems == ("error: remote process exited",)


def test_argv_and_sizes(tmp_path: Path) -> None:
    argv = alltoall_perf_argv(
        Path("/x/alltoall_perf"), 1024, gpus=2, iters=20, warmup=5, json_path=tmp_path / "o.json"
    )
    assert argv == [
        "/x/alltoall_perf", "-b", "1024", "-e", "1024", "-f", "2", "-g", "2", "-d", "bfloat16",
        "-n", "20", "-w", "5", "-J", str(tmp_path / "o.json"),
    ]  # fmt: skip
    assert aligned_size(1000, 2) == 1024
    assert aligned_size(1024, 2) == 1024
    assert aligned_size(1, 8) == 128


def _fake_binary(tmp_path: Path, script: str) -> Path:
    exe = tmp_path / "alltoall_perf"
    exe.write_text(f"#!{sys.executable}\n{script}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


FAKE = """
import sys, shutil
fix = {fix!r}
if "--help" in sys.argv:
    print("USAGE: alltoall_perf \\n\\t[-J,--output_file <file> write output to filepath] \\n\\t[-h,--help]" if {json} else "USAGE: x [-h,--help]")
    sys.exit(0)
sys.stdout.write(open(fix + "/{text}").read())
if "-J" in sys.argv:
    shutil.copy(fix + "/{jsonfile}", sys.argv[sys.argv.index("-J") + 1])
{exit}
"""


def test_find_binary(tmp_path: Path) -> None:
    exe = _fake_binary(tmp_path, "")
    assert find_alltoall_perf(tmp_path) == exe
    assert find_alltoall_perf(None, search_path=str(tmp_path)) == exe
    with pytest.raises(BackendUnavailable, match="not found on PATH"):
        find_alltoall_perf(None, search_path=str(tmp_path / "none"))
    with pytest.raises(BackendUnavailable, match="not an executable"):
        find_alltoall_perf(tmp_path / "missing")


def test_run_prefers_json_when_supported(tmp_path: Path) -> None:
    exe = _fake_binary(
        tmp_path,
        FAKE.format(
            fix=str(FIX), json=True, text="text_ok.txt", jsonfile="alltoall_v2.json", exit="sys.exit(0)"
        ),
    )
    assert supports_json(exe)
    run = run_alltoall_perf([134217728], binary=exe, gpus=2, workdir=tmp_path)
    assert run.json_output
    (res,) = run.results
    assert res.source == "json" and res.status == "ok" and len(res.rows) == 1
    assert res.nccl_tests_version == "2.17.6"  # from the text's version line
    assert "-J" in res.argv and res.returncode == 0


def test_run_falls_back_to_text_when_json_is_cut_off(tmp_path: Path) -> None:
    exe = _fake_binary(
        tmp_path,
        FAKE.format(
            fix=str(FIX),
            json=True,
            text="text_truncated.txt",
            jsonfile="alltoall_truncated.json",
            exit="import os; os.kill(os.getpid(), 9)",
        ),
    )
    (res,) = run_alltoall_perf([1], binary=exe, gpus=2, workdir=tmp_path).results
    assert res.source == "text" and res.status == "truncated" and res.returncode == -9


def test_run_text_only_binary_with_bad_exit(tmp_path: Path) -> None:
    exe = _fake_binary(
        tmp_path, FAKE.format(fix=str(FIX), json=False, text="text_ok.txt", jsonfile="", exit="sys.exit(3)")
    )
    assert not supports_json(exe)
    (res,) = run_alltoall_perf([1], binary=exe, gpus=2, workdir=tmp_path).results
    assert "-J" not in res.argv
    assert res.status == "exit_code" and "exit code 3" in res.problems


def test_run_timeout_is_a_result(tmp_path: Path) -> None:
    exe = _fake_binary(tmp_path, "import sys, time\nif '--help' in sys.argv: sys.exit(0)\ntime.sleep(30)\n")
    (res,) = run_alltoall_perf([1], binary=exe, gpus=2, timeout_s=1, workdir=tmp_path).results
    assert res.returncode is None and res.status == "no_results"
    assert any("timed out" in p for p in res.problems)


def test_unavailable_reason_is_said_once(tmp_path: Path) -> None:
    """`moelab backends` without alltoall_perf: one reason, saying what to do once."""
    from typer.testing import CliRunner

    from moelab.cli.main import app

    env = {"PATH": str(tmp_path)}  # a PATH without alltoall_perf
    result = CliRunner().invoke(app, ["backends"], env=env)
    assert result.exit_code == 0, result.output
    line = " ".join(x for x in result.output.splitlines() if "nccl-tests" in x)
    assert "alltoall_perf not found on PATH" in line
    assert line.count("--nccl-tests-bin") == 1 and line.count("not found") == 1
