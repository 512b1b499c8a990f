"""The gate never passes what it cannot judge (issue 26, item 3), each defect through `moelab check` on a
real store (synthetic run directories through the real ingest, then the samples damaged as the defects
found them): NaN/NULL, zero or missing samples, an op missing from the candidate, another GPU, driver,
NCCL or world size, and a contended run."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.gate.history_runs import history
from tests.synthetic_runs import RunModel, build_db

COMMON = dict(tokens=(256,), sms=(None,), iters=40, noise=0.005)
BUSY = "host load 8.0 on 2 cores (7.0 beyond this run's 2 ranks)"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("refusals")
    db = root / "g.duckdb"
    runs = [
        ("base", {}),
        ("nan", {}),  # every dispatch sample NULL (NaN is stored as NULL)
        ("slow", {"slowdown": 1.10}),  # early: the history of the runs before it holds no step
        ("nan_slow", {"slowdown": 1.10}),  # 10% slower, its samples NaN
        ("zero", {}),  # every sample 0
        ("no_op", {}),  # the combine op's result and samples gone
        ("no_samples", {}),  # the result kept, its samples gone
        ("h100", {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "575.57.08", "nccl": "2.27.3"}),
        ("world4", {"world": 4}),
        ("busy", {"contended": BUSY}),  # identical workload, a contended machine
        ("busy_slow", {"contended": BUSY, "slowdown": 1.6}),
    ]
    build_db(
        db,
        root / "runs",
        history(6, **COMMON)
        + [
            RunModel(
                run_id=name, created_at=f"2026-11-{20 + i:02d}T07:00:00+00:00", seed=i, **COMMON, **extra
            )  # type: ignore[arg-type]
            for i, (name, extra) in enumerate(runs)
        ],
    )
    con = duckdb.connect(str(db))
    try:
        con.execute("UPDATE samples SET time_us = 'nan'::DOUBLE WHERE run_id = 'nan_slow'")
        con.execute("UPDATE samples SET time_us = NULL WHERE run_id = 'nan' AND op = 'dispatch'")
        con.execute("UPDATE samples SET time_us = 0 WHERE run_id = 'zero'")
        con.execute("DELETE FROM samples WHERE run_id = 'no_op' AND op = 'combine'")
        con.execute("DELETE FROM results WHERE run_id = 'no_op' AND op = 'combine'")
        con.execute("DELETE FROM samples WHERE run_id = 'no_samples' AND op = 'roundtrip'")
    finally:
        con.close()
    return db


def _check(db: Path, run: str, *extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["check", "--db", str(db), "--baseline", "base", "--run", run, *extra])
    return r.exit_code, r.output


@pytest.mark.parametrize("run", ["nan", "nan_slow", "zero"])
def test_nan_null_or_zero_samples_are_never_passed(store: Path, run: str) -> None:
    """Before: median "nan", verdict "improvement", exit 0 (and "improvement -100%" for zeros)."""
    code, out = _check(store, run)
    assert code == 3, out
    assert "CANNOT JUDGE" in out and "invalid" in out and "improvement" not in out
    assert "NULL, NaN, infinite or not above zero" in out


def test_an_op_missing_from_the_candidate_is_named(store: Path) -> None:
    """Before: the candidate's missing combine was silently not compared, exit 0."""
    code, out = _check(store, "no_op")
    assert code == 3, out
    assert "combine" in out and "candidate has no result for this op" in out
    code, out = _check(store, "no_samples")
    assert code == 3 and "candidate has a result but no samples" in out, out


def test_another_gpu_driver_and_nccl_are_refused_unless_allowed(store: Path, tmp_path: Path) -> None:
    """Before: an H200 baseline against an H100 candidate passed without a word."""
    junit = tmp_path / "j.xml"
    code, out = _check(store, "h100", "--junit", str(junit))
    assert code == 3, out
    for named in (
        "REFUSED",
        "GPU: NVIDIA H200 (baseline) vs NVIDIA H100 80GB HBM3",
        "driver",
        "NCCL: 2.28.9",
    ):
        assert named in out, named
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "1" and root.get("failures") == "0"
    code, out = _check(store, "h100", "--allow-different-hardware")
    assert "compared across a difference" in out and "NVIDIA H100 80GB HBM3" in out, out
    # no earlier run on the H100: roundtrip (host-sync) is held to its prior, too wide to judge at repeat 1
    assert code == 3 and "cannot judge" in out, out
    assert "\nPASS" not in out and not out.startswith("PASS"), out
    # the advice names a count --repeat takes, or says none would do (never one it refuses)
    assert "use --repeat" in out or "more starts than --repeat allows (1,000)" in out, out


def test_another_world_size_is_refused(store: Path) -> None:
    code, out = _check(store, "world4")
    assert code == 3 and "world size: 2 (baseline) vs 4 (candidate)" in out, out


def test_a_contended_run_gets_no_regression_verdict(store: Path) -> None:
    """Before: two identical runs on a busy machine came out as a >50% regression, exit 1."""
    for run in ("busy", "busy_slow"):
        code, out = _check(store, run)
        assert code == 4, out
        assert "CONTENDED" in out and "regression" not in out and "(candidate: host-load" in out
    assert _check(store, "slow")[0] == 1  # the same slowdown on a quiet machine fails the gate


def test_contended_as_baseline_too(store: Path) -> None:
    r = CliRunner().invoke(app, ["check", "--db", str(store), "--baseline", "busy", "--run", "slow"])
    assert r.exit_code == 4 and "(baseline: host-load" in r.output, r.output
