"""The report's verification section: `moelab verify` rows (a library's own figure beside moelab's), with
verdicts; mismatches are findings listed first."""

from __future__ import annotations

from typing import Any

import duckdb

from moelab.reports.query import select
from moelab.store.db import has_table

VERDICT_ORDER = {"fail": 0, "error": 1, "missing": 2, "unsupported": 3, "skipped": 4, "pass": 5}


def library_figures(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Rows of the selected runs (`_sel`), findings first; none for a database older than the table."""
    if not has_table(con, "library_figures"):
        return []
    rows = select(
        con,
        """SELECT run_id, backend, library_test, op, dtype, figure, case_id, library_label, library_gbps,
              moelab_gbps, ratio, tolerance, verdict, source_log, note
           FROM library_figures SEMI JOIN _sel USING (run_id) ORDER BY run_id, backend, dtype, op, figure""",
    )
    for r in rows:
        r["note_first_line"] = (r["note"] or "").splitlines()[0] if r["note"] else ""
    return sorted(rows, key=lambda r: (VERDICT_ORDER.get(r["verdict"], 9), r["run_id"], r["backend"]))
