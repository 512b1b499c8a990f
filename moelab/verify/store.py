"""`library_figures` rows in the database. The run directory keeps them too (RunDir.write_library_figures),
so a re-ingest restores them."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from moelab.core.library_figures import VerifyRow

COLUMNS = tuple(VerifyRow.__dataclass_fields__)


def store(
    con: duckdb.DuckDBPyConnection, run_id: str, rows: Sequence[VerifyRow], definitions: dict[str, str]
) -> None:
    """Replace the run's library figures with `rows`, in one transaction; add the definitions verify derives."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM library_figures WHERE run_id = ?", [run_id])
        if rows:
            marks = ", ".join(["?"] * len(COLUMNS))
            con.executemany(
                f"INSERT INTO library_figures ({', '.join(COLUMNS)}) VALUES ({marks})",
                [tuple(r.to_dict()[c] for c in COLUMNS) for r in rows],
            )
        for name, text in definitions.items():
            con.execute("INSERT OR REPLACE INTO definitions VALUES (?, ?)", [name, text])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


def load(con: duckdb.DuckDBPyConnection, run_id: str) -> list[VerifyRow]:
    cur = con.execute(
        f"SELECT {', '.join(COLUMNS)} FROM library_figures WHERE run_id = ? "
        "ORDER BY backend, dtype, op, figure",
        [run_id],
    )
    return [VerifyRow(**dict(zip(COLUMNS, r, strict=True))) for r in cur.fetchall()]
