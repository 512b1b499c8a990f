"""A plugin backend that declares its library's own benchmark (tests/plugins: `test-lib`, a stand-in
bench.py that prints figures in a format of its own) is verified through `moelab verify` like a built-in
one, with no edit of moelab: its command is planned, run, parsed, and each figure set beside moelab's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.verify.libraries import verify_definitions
from moelab.verify.plan import library_tests

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "verify"
runner = CliRunner()
LIB_FIGURE = "test_lib_rank0_bytes_over_mean_time"  # the plugin's own figure (tests/plugins)


@pytest.fixture
def bench_tree(tmp_path: Path, plugin_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plugin library's source tree, its benchmark printing `rates` GB/s per payload."""
    tree = tmp_path / "testlib"
    tree.mkdir()
    shutil.copy(FIX / "fake_own_bench.py", tree / "bench.py")
    (tmp_path / "rates.json").write_text(json.dumps({"bf16": 1234.5}))
    monkeypatch.setenv("FAKE_BENCH", str(tmp_path / "rates.json"))
    return tree


def _args(tmp_path: Path, tree: Path, *extra: str) -> list[str]:
    return [
        "verify",
        "--cpu",
        "--no-health",
        "--backend",
        "test-lib",
        "--backend-path",
        f"test-lib={tree}",
        "--hidden",
        "256",
        "--tokens-per-rank",
        "64",
        "--dtype",
        "bf16",
        "--iters",
        "3",
        "--db",
        str(tmp_path / "v.duckdb"),
        "--out",
        str(tmp_path / "runs"),
        *extra,
    ]


def test_verify_knows_the_plugin_from_its_class(bench_tree: Path, tmp_path: Path) -> None:
    assert "test-lib" in library_tests() and "test-host" not in library_tests()
    assert set(verify_definitions()) >= {"nccl_algbw", "nccl_busbw"}
    res = runner.invoke(app, _args(tmp_path, bench_tree, "--dry-run"))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert any(line.startswith("# moelab test-lib: case h256-t64-k8-e8-uniform-s0-bf16") for line in lines)
    assert (
        f"cd {bench_tree} && " in res.stdout and "bench.py --ranks 2 --tokens 64 --hidden 256" in res.stdout
    )
    res = runner.invoke(app, ["verify", "--cpu", "--dry-run", "--backend", "test-jit"])
    assert (
        res.exit_code == 2 and "verify knows no backend 'test-jit'" in res.stderr and "test-lib" in res.stderr
    )
    res = runner.invoke(app, ["verify", "--cpu", "--dry-run", "--backend", "test-lib"])
    assert res.exit_code == 0 and "# test-lib: needs --backend-path test-lib=DIR" in res.stdout


@pytest.mark.slow
def test_a_plugin_is_verified_against_its_own_benchmark(bench_tree: Path, tmp_path: Path) -> None:
    """moelab measures test-lib on 2 CPU ranks (its own figure, computed as its benchmark computes it), then
    runs bench.py; the row sets the stand-in's 1234.5 GB/s beside moelab's stored figure: a mismatch, exit 1."""
    res = runner.invoke(app, _args(tmp_path, bench_tree))
    assert res.exit_code == 1, res.output
    with duckdb.connect(str(tmp_path / "v.duckdb"), read_only=True) as con:
        rows = con.execute(
            "SELECT backend, library_test, op, dtype, figure, case_id, library_gbps, moelab_gbps, ratio, verdict, "
            "source_log FROM library_figures"
        ).fetchall()
        stored = con.execute(
            "SELECT case_id, gbps FROM bandwidths WHERE backend = 'test-lib' AND op = 'dispatch' AND definition = ?",
            [LIB_FIGURE],
        ).fetchall()
    assert len(rows) == 1 and len(stored) == 1
    backend, test, op, dtype, figure, case_id, library, moelab, ratio, verdict, log = rows[0]
    assert (backend, test, op, dtype, figure, library) == (
        "test-lib",
        "bench.py",
        "dispatch",
        "bf16",
        LIB_FIGURE,
        1234.5,
    )
    assert (case_id, moelab) == stored[0] and ratio == pytest.approx(moelab / library) and verdict == "fail"
    run_dir = next((tmp_path / "runs").iterdir())
    assert "bench: 2 ranks, 64 tokens x 256, top-8 of 16 experts" in (run_dir / log).read_text()
    assert "test-lib" in res.stdout and "fail" in res.stdout
