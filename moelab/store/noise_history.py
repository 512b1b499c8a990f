"""The store's history of a case's op as the gate's noise model and change-point search read it: each
earlier run's per-process medians (one value for a run without --repeat), on the same hardware and
software as a given run, and each run's median of one series over the whole store with what it ran on."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import duckdb

from moelab.store.db import has_column, has_table

HistoryKey = tuple[str, str, str]  # backend, case_id, op

_FINGERPRINT = """
    SELECT run_id, backend, any_value(gpu_name) AS gpu_name, any_value(driver) AS driver,
           any_value(cuda) AS cuda, any_value(nccl) AS nccl, any_value(torch) AS torch,
           any_value(CAST(library_versions AS VARCHAR)) AS libs
    FROM environment GROUP BY run_id, backend
"""


def _process_medians_sql(con: duckdb.DuckDBPyConnection) -> str:
    if has_table(con, "process_results"):
        return """(SELECT list(p.median_us ORDER BY p.repeat) FROM process_results p
                   WHERE p.run_id = res.run_id AND p.backend = res.backend AND p.case_id = res.case_id
                     AND p.op = res.op)"""
    return "NULL"


def earlier_process_medians(
    con: duckdb.DuckDBPyConnection, run_id: str, leave_out: Sequence[str] = ()
) -> dict[HistoryKey, list[list[float]]]:
    """Per (backend, case, op) measured by `run_id`: the per-process medians of each earlier run (oldest
    first) with the same device, world, GPU model, driver, CUDA, NCCL, torch and library versions, whose
    case was measured and not marked suspect at ingest; runs in `leave_out` (the baseline) are skipped."""
    suspect = "NOT coalesce(c.suspect, false)" if has_column(con, "cases", "suspect") else "true"
    rows = con.execute(
        f"""
        WITH fp AS ({_FINGERPRINT}),
        cur AS (SELECT f.*, r.created_at, r.world, r.device FROM fp f JOIN runs r USING (run_id)
                WHERE f.run_id = ?),
        earlier AS (
            SELECT f.run_id, f.backend, r.created_at FROM fp f JOIN runs r USING (run_id)
            JOIN cur ON f.backend = cur.backend
            WHERE r.created_at < cur.created_at AND f.run_id <> cur.run_id
              AND NOT list_contains(?::VARCHAR[], f.run_id)
              AND r.device IS NOT DISTINCT FROM cur.device AND r.world IS NOT DISTINCT FROM cur.world
              AND f.gpu_name IS NOT DISTINCT FROM cur.gpu_name AND f.driver IS NOT DISTINCT FROM cur.driver
              AND f.cuda IS NOT DISTINCT FROM cur.cuda AND f.nccl IS NOT DISTINCT FROM cur.nccl
              AND f.torch IS NOT DISTINCT FROM cur.torch AND f.libs IS NOT DISTINCT FROM cur.libs)
        SELECT res.backend, res.case_id, res.op, e.created_at, res.median_us, {_process_medians_sql(con)}
        FROM earlier e JOIN results res USING (run_id, backend)
        JOIN cases c USING (run_id, backend, case_id)
        WHERE c.status = 'ok' AND {suspect}
          AND (res.backend, res.case_id, res.op) IN (SELECT (backend, case_id, op) FROM results WHERE run_id = ?)
        ORDER BY res.backend, res.case_id, res.op, e.created_at, e.run_id
        """,
        [run_id, list(leave_out), run_id],
    ).fetchall()
    out: dict[HistoryKey, list[list[float]]] = defaultdict(list)
    for backend, case_id, op, _created, median, per_process in rows:
        values = [float(x) for x in (per_process or [median]) if x is not None]
        values = [x for x in values if x > 0 and x == x and x != float("inf")]
        if values:
            out[(backend, case_id, op)].append(values)
    return dict(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class SeriesPoint:
    """One run's median of one case and op, with what it ran on."""

    run_id: str
    created_at: datetime
    backend: str
    case_id: str
    op: str
    median_us: float | None
    hardware: str  # GPU model x world (device where no GPU was recorded): never mixed in one series
    software: str  # driver, CUDA, NCCL, torch and libraries, to name what changed at a step
    git_sha: str | None


def series(con: duckdb.DuckDBPyConnection) -> list[SeriesPoint]:
    """Every stored run's median of every case and op it measured, oldest first."""
    rows = con.execute(
        f"""
        WITH fp AS ({_FINGERPRINT})
        SELECT r.run_id, r.created_at, res.backend, res.case_id, res.op, res.median_us,
               coalesce(f.gpu_name, r.device) || ' x' || coalesce(CAST(r.world AS VARCHAR), '?'),
               'driver ' || coalesce(f.driver, '?') || ', CUDA ' || coalesce(f.cuda, '?') || ', NCCL '
                 || coalesce(f.nccl, '?') || ', torch ' || coalesce(f.torch, '?') || ', libraries '
                 || coalesce(f.libs, '{{}}'),
               r.git_sha
        FROM results res JOIN runs r USING (run_id) LEFT JOIN fp f USING (run_id, backend)
        JOIN cases c USING (run_id, backend, case_id)
        WHERE c.status = 'ok'
        ORDER BY res.backend, res.case_id, res.op, r.created_at, r.run_id
        """
    ).fetchall()
    return [
        SeriesPoint(
            run_id=r[0],
            created_at=r[1],
            backend=r[2],
            case_id=r[3],
            op=r[4],
            median_us=None if r[5] is None else float(r[5]),
            hardware=str(r[6]),
            software=str(r[7]),
            git_sha=r[8],
        )
        for r in rows
    ]
