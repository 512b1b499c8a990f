"""Judgments (moelab.health.judge, on the history moelab.store.run_history reads) in their own table: made after a run is stored, never written over the
measured rows. `cases_judged` and `results_judged` (views, moelab.store.schema) show each case's suspect
mark and each op's stability with the judgments joined in; readers use those."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

from moelab.health.judge import Judgment
from moelab.store.run_history import judge_stored_run

COLUMNS = tuple(f.name for f in fields(Judgment))


def replace_judgments(con: Any, judged_by: str, judgments: Sequence[Judgment]) -> None:
    """The judgments made while judging run `judged_by`, replacing any earlier ones (judging twice stores
    them once), in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM judgments WHERE judged_by = ?", [judged_by])
        rows = [(*(asdict(j)[c] for c in COLUMNS), seq) for seq, j in enumerate(judgments)]
        if rows:
            marks = ", ".join(["?"] * (len(COLUMNS) + 1))
            con.executemany(f"INSERT INTO judgments ({', '.join(COLUMNS)}, seq) VALUES ({marks})", rows)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


def judge(con: Any, run_id: str) -> list[Judgment]:
    """Judge a stored run and keep the judgments; returns them."""
    found = judge_stored_run(con, run_id)
    replace_judgments(con, run_id, found)
    return found
