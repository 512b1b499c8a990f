"""`moelab run --repeat N` on real gloo ranks (issue 29, item 1): every backend job starts N times in
rotated order, each start stored as a process sample of its own."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.launch.test_crash_isolation import SMALL


@pytest.mark.slow
def test_repeats_run_in_rotated_order_and_are_stored(tmp_path: Path, db_path: Path) -> None:
    out = tmp_path / "runs"
    # SMALL's own --iters 2 and --sms default, as they always ran (a flag given twice is refused now)
    args = [
        "run",
        "--cpu",
        "--backend",
        "nccl-a2a,mxfp8-a2a",
        "--repeat",
        "2",
        "--no-health",
        "--out",
        str(out),
        "--run-id",
        "rep",
        *SMALL,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    order = [
        line.split("]")[0][1:]
        for line in result.output.splitlines()
        if line.startswith("[") and "cases on" in line
    ]
    assert order == ["nccl-a2a 1/2", "mxfp8-a2a 1/2", "mxfp8-a2a 2/2", "nccl-a2a 2/2"]
    assert "medians: of the 2 per-process medians (--repeat)" in result.output
    # every progress line names its backend, a repeated start's too (its folder is r1: round 5's GPU call
    # showed "[r1] case 1/1 ...")
    prefixes = {
        line.split("]")[0][1:].split()[0] for line in result.output.splitlines() if line.startswith("[")
    }
    assert prefixes == {"nccl-a2a", "mxfp8-a2a"}, prefixes
    assert (out / "rep" / "nccl-a2a" / "r1" / "results.jsonl").is_file()
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        assert con.execute(
            "SELECT backend, repeat, position FROM processes ORDER BY position"
        ).fetchall() == [
            ("nccl-a2a", 0, 0),
            ("mxfp8-a2a", 0, 1),
            ("mxfp8-a2a", 1, 2),
            ("nccl-a2a", 1, 3),
        ]
        assert con.execute("SELECT DISTINCT status FROM cases").fetchall() == [("ok",)]
        repeats = con.execute("SELECT DISTINCT repeats FROM results").fetchall()
        assert repeats == [(2,)]
        starts = con.execute(
            "SELECT backend, op, count(DISTINCT repeat) FROM samples GROUP BY ALL HAVING count(DISTINCT repeat) <> 2"
        ).fetchall()
        assert starts == []
        intervals = con.execute(
            "SELECT count(*) FROM results r WHERE ci_low_us <= median_us AND median_us <= ci_high_us "
            "AND median_us = (SELECT median(p.median_us) FROM process_results p WHERE p.run_id = r.run_id "
            "AND p.backend = r.backend AND p.case_id = r.case_id AND p.op = r.op)"
        ).fetchone()
        total = con.execute("SELECT count(*) FROM results").fetchone()
        assert intervals == total and total is not None and total[0] == 2 * 6  # 5 ops and the chained pair
        pairs = con.execute(
            "SELECT backend, host_sync FROM results WHERE op = 'pair' ORDER BY backend"
        ).fetchall()
        assert pairs == [("mxfp8-a2a", None), ("nccl-a2a", None)]  # stored beside roundtrip, no host sync
    finally:
        con.close()
