"""`moelab check --history` (issue 38): where each case's median stepped over the store's history, by
ruptures' binary segmentation, on synthetic 200-run stores (tests/synthetic_history.py); a history that
spans hardware is split, one with NaN medians refused, each in one line."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.gate.changes import find_changes
from moelab.store.noise_history import series
from tests.synthetic_history import HistoryModel, build

STEP_AT = 137  # the first run 8% slower


def _store(path: Path, **model: object) -> Path:
    con = duckdb.connect(str(path))
    try:
        build(con, HistoryModel(runs=200, samples_per_run=0, noise=0.01, **model))  # type: ignore[arg-type]
    finally:
        con.close()
    return path


def _history(db: Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["check", "--history", "--db", str(db)], terminal_width=250)
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(
        tmp_path_factory.mktemp("steps") / "h.duckdb", steps={("deepep", "dispatch"): [(STEP_AT, 1.08)]}
    )


def test_an_eight_percent_step_is_placed_within_one_run(stepped: Path) -> None:
    code, out = _history(stepped)
    assert code == 0, out
    assert "2 steps in 12 series" in out  # deepep dispatch, in both SM settings; nothing else moved
    found = {int(m) for m in re.findall(r"r(\d{6})\s", out)}
    steps = [c for c in find_changes(_series(stepped)).changes]
    assert len(steps) == 2 and {(c.backend, c.op) for c in steps} == {("deepep", "dispatch")}
    for c in steps:
        assert abs(int(c.run_id[1:]) - STEP_AT) <= 1 and c.change == pytest.approx(0.08, abs=0.01)
        assert int(c.run_id[1:]) in found


def test_no_step_in_a_history_without_one(tmp_path: Path) -> None:
    code, out = _history(_store(tmp_path / "flat.duckdb"))
    assert code == 0, out
    assert "0 steps in 12 series" in out


def test_a_step_at_a_software_change_names_it(tmp_path: Path) -> None:
    db = _store(
        tmp_path / "driver.duckdb", steps={("nccl-a2a", "combine"): [(100, 1.10)]}
    )  # the driver changes at 100
    changes = find_changes(_series(db)).changes
    assert changes and all("driver 580.65.06 -> 590.10.01" in c.changed for c in changes)
    # the report's history section names it too
    out = tmp_path / "h.md"
    r = CliRunner().invoke(app, ["report", "--history", "--format", "md", "--db", str(db), "-o", str(out)])
    assert r.exit_code == 0, r.output
    steps = out.read_text().split("**Detected steps**")[1].split("\n\n**")[0]
    assert steps.count("driver 580.65.06 → 590.10.01") == 2  # nccl-a2a combine, both SM settings


def test_mixed_hardware_is_split_and_nan_refused(tmp_path: Path) -> None:
    db = _store(tmp_path / "mixed.duckdb")
    con = duckdb.connect(str(db))
    try:
        con.execute("UPDATE environment SET gpu_name = 'NVIDIA H100' WHERE run_id >= 'r000150'")
        con.execute("UPDATE results SET median_us = 'nan'::DOUBLE WHERE run_id = 'r000010' AND op = 'pair'")
    finally:
        con.close()
    code, out = _history(db)
    assert code == 0, out
    lines = out.splitlines()
    split = [ln for ln in lines if "history split by hardware" in ln]
    assert len(split) == 12 and all(
        "NVIDIA H200 x2 (150 runs), NVIDIA H100 x2 (50 runs)" in ln for ln in split
    )
    refused = [ln for ln in lines if "refused" in ln]
    assert len(refused) == 4 and all(
        " pair " in ln and "r000010" in ln for ln in refused
    )  # 2 backends x 2 SMs
    assert "0 steps" in out  # the H100 runs are as fast: no step placed across the two


def test_history_takes_no_baseline(stepped: Path) -> None:
    r = CliRunner().invoke(app, ["check", "--history", "--baseline", "main", "--db", str(stepped)])
    assert r.exit_code == 2 and r.output.startswith("error: ")
    r = CliRunner().invoke(app, ["check", "--db", str(stepped)])
    assert r.exit_code == 2 and "--history" in r.output


def _series(db: Path) -> list:  # type: ignore[type-arg]
    con = duckdb.connect(str(db), read_only=True)
    try:
        return series(con)
    finally:
        con.close()


def test_gaps_are_named_in_one_line(tmp_path: Path) -> None:
    db = _store(tmp_path / "gaps.duckdb")
    con = duckdb.connect(str(db))
    try:
        con.execute(
            "DELETE FROM results WHERE case_id = 'deepep-sm24' AND op = 'combine' AND run_id BETWEEN 'r000050' AND 'r000059'"
        )
    finally:
        con.close()
    code, out = _history(db)
    assert code == 0, out
    (gap,) = [ln for ln in out.splitlines() if "gaps" in ln]
    assert (
        "deepep deepep-sm24 combine: 10 runs on this hardware" in gap and "the 190 runs that have it" in gap
    )
