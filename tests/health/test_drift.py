"""Run-to-run drift: an op whose median moved between two runs of the same case on the same machine and
software is marked unstable in both runs; a changed driver is not drift."""

from __future__ import annotations

from pathlib import Path

from moelab.health.drift import DRIFT_TOLERANCE
from moelab.store.db import connect
from moelab.store.judgments import judge
from moelab.store.run_history import drift_flags
from tests.synthetic_runs import RunModel, build_db


def _stability(con: object, run_id: str, table: str = "results_judged") -> list[str]:
    rows = con.execute(  # type: ignore[attr-defined]
        f"SELECT stability FROM {table} WHERE run_id = ? AND stability IS NOT NULL ORDER BY ALL", [run_id]
    ).fetchall()
    return [r[0] for r in rows]


def test_a_moved_median_marks_both_runs_and_names_the_other(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    build_db(db, tmp_path / "runs", [
        RunModel(run_id="a", created_at="2026-11-20T07:00:00+00:00", noise=0.005, seed=1, iters=60),
        RunModel(run_id="b", created_at="2026-11-20T08:00:00+00:00", noise=0.005, seed=2, iters=60),
        RunModel(run_id="c", created_at="2026-11-20T09:00:00+00:00", noise=0.005, seed=3, iters=60, slowdown=1.2),
        RunModel(run_id="d", created_at="2026-11-20T10:00:00+00:00", noise=0.005, seed=4, iters=60,
                 slowdown=1.2, driver="590.10.01"),
    ])  # fmt: skip
    con = connect(db)
    try:
        assert drift_flags(con, "b") == []  # same mode twice: no drift
        assert judge(con, "b") == []
        measured_b = _stability(con, "b", "results")
        flags = drift_flags(con, "c")
        judged = judge(con, "c")
        assert {(j.run_id, j.verdict) for j in judged} == {
            ("c", "unstable"),
            ("b", "unstable"),
            ("c", "suspect"),
        }
        assert flags and all(f.previous_run == "b" for f in flags)
        assert all(abs(f.change - 0.2) < 0.05 and abs(f.change) > DRIFT_TOLERANCE for f in flags)
        mine, theirs = _stability(con, "c"), _stability(con, "b")
        assert len(mine) == len(flags) == len(theirs)
        assert all("from run b's" in s and "+" in s for s in mine)
        assert all("from run c's" in s and "-" in s for s in theirs)
        suspect = con.execute("SELECT count(*) FROM cases_judged WHERE run_id = 'c' AND suspect").fetchone()[
            0
        ]
        assert suspect >= 1
        # judgments never rewrite what was measured: b's stored rows are as ingest left them
        assert _stability(con, "b", "results") == measured_b
        assert con.execute("SELECT count(*) FROM cases WHERE run_id = 'c' AND suspect").fetchone()[0] == 0
        judge(con, "c")  # judging twice adds nothing twice
        assert _stability(con, "c") == mine
        # a new driver is not drift (the gate's business), and CPU runs are not judged
        assert drift_flags(con, "d") == []
        assert drift_flags(con, "c", devices=("cpu",)) == []
    finally:
        con.close()
