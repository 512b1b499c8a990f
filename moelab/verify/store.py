"""`library_figures` rows: written to RUN_DIR/verify/library_figures.json (the run directory stays the source
of every stored number, so a re-ingest restores them) and stored in the run's database rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from moelab.verify.figures import VerifyRow

FILE = Path("verify") / "library_figures.json"
COLUMNS = tuple(VerifyRow.__dataclass_fields__)


def write_file(run_dir: Path, rows: Sequence[VerifyRow]) -> Path:
    path = run_dir / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.to_dict() for r in rows], indent=2))
    return path


def rows_from_run_dir(run_dir: Path) -> list[dict[str, Any]]:
    """The table rows of a run directory as {column: value} (none when verify never ran on it), for ingest."""
    path = run_dir / FILE
    if not path.exists():
        return []
    return [{c: VerifyRow.from_dict(d).to_dict()[c] for c in COLUMNS} for d in json.loads(path.read_text())]


def store(
    con: duckdb.DuckDBPyConnection, run_id: str, rows: Sequence[VerifyRow], definitions: dict[str, str]
) -> None:
    """Replace the run's library figures with `rows`, in one transaction; add the definitions verify derives."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM library_figures WHERE run_id = ?", [run_id])
        if rows:
            marks = ", ".join(["?"] * len(COLUMNS))
            con.executemany(f"INSERT INTO library_figures ({', '.join(COLUMNS)}) VALUES ({marks})",
                            [tuple(r.to_dict()[c] for c in COLUMNS) for r in rows])  # fmt: skip
        for name, text in definitions.items():
            con.execute("INSERT OR REPLACE INTO definitions VALUES (?, ?)", [name, text])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


def load(con: duckdb.DuckDBPyConnection, run_id: str) -> list[VerifyRow]:
    cur = con.execute(f"SELECT {', '.join(COLUMNS)} FROM library_figures WHERE run_id = ? "
                      "ORDER BY backend, dtype, op, figure", [run_id])  # fmt: skip
    return [VerifyRow(**dict(zip(COLUMNS, r, strict=True))) for r in cur.fetchall()]
