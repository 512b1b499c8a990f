"""The starts of a repeated run (--repeat N) that are missing: stopped by the user's signal before they
ended, or never begun. Their run is partial: its figures are over the starts that finished (ingest), and
report and compare say which starts they lack."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from moelab.store.db import has_table

# how a job's start ended when the user's stop (SIGINT/SIGTERM) cut it short or kept it from running: no
# fault of the backend's (moelab.store.ingest's job statuses)
MISSING_STATUSES = ("not-run", "interrupted")


@dataclass(frozen=True, slots=True)
class MissingStart:
    run_id: str
    backend: str
    start: int  # 1 for the first start
    starts: int  # how many the run asked for
    why: str

    def text(self) -> str:
        return f"{self.backend} start {self.start} of {self.starts} ({self.why})"


def missing_starts(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[MissingStart]:
    """The missing starts of these runs, in run, backend and start order."""
    if not run_ids or not has_table(con, "processes"):
        return []
    rows = con.execute(
        """SELECT run_id, backend, repeat, count(*) OVER (PARTITION BY run_id, backend), status, description
           FROM processes WHERE list_contains(?, run_id)
           QUALIFY list_contains(?, status)
           ORDER BY run_id, backend, repeat""",
        [list(run_ids), list(MISSING_STATUSES)],
    ).fetchall()
    return [
        MissingStart(
            run_id=r[0],
            backend=r[1],
            start=int(r[2]) + 1,
            starts=int(r[3]),
            why=_why(str(r[4]), r[5]),
        )
        for r in rows
    ]


def _why(status: str, description: str | None) -> str:
    if status == "not-run":
        return "did not run"
    first = (description or "").split(";")[0].strip()
    return first or "interrupted"


def partial_notes(missing: Sequence[MissingStart]) -> list[str]:
    """One line per partial run: the starts it lacks; its figures are over the others."""
    by_run: dict[str, list[MissingStart]] = {}
    for m in missing:
        by_run.setdefault(m.run_id, []).append(m)
    return [
        f"run {run_id} is partial: missing {', '.join(m.text() for m in ms)}; "
        "its figures are over the starts that finished"
        for run_id, ms in by_run.items()
    ]
