"""Finding the two sides of a check: the candidate run in the database and the baseline, given as a
label, a run id, or an export folder committed in a repository (`moelab db export`)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from moelab.core.errors import MoelabError
from moelab.gate.samples import Side, load_side
from moelab.store.db import migrate
from moelab.store.export import load_export
from moelab.store.labels import resolve_run


def load_baseline(con: duckdb.DuckDBPyConnection | None, ref: str) -> tuple[Side, str]:
    """(side, description). A folder with a manifest.json is an export; anything else is resolved in
    the database as a label, then a run's own label, then a run id."""
    path = Path(ref)
    if path.is_dir():
        mem = duckdb.connect(":memory:")
        try:
            migrate(mem)
            ids = load_export(mem, path)
            if not ids:
                raise MoelabError(f"export {path} holds no runs")
            row = mem.execute(
                "SELECT run_id FROM runs WHERE run_id IN (SELECT UNNEST(?::VARCHAR[])) ORDER BY created_at DESC, run_id DESC LIMIT 1",
                [ids],
            ).fetchone()
            run_id = str(row[0]) if row else ids[-1]
            note = f" (newest of {len(ids)})" if len(ids) > 1 else ""
            return load_side(mem, run_id, where=str(path)), f"export {path}, run {run_id}{note}"
        finally:
            mem.close()
    if path.suffix or "/" in ref:
        if not path.exists():
            raise MoelabError(f"baseline {ref} looks like a path but does not exist")
        raise MoelabError(f"baseline {ref} is a file; give the export folder (with manifest.json)")
    if con is None:
        raise MoelabError(f"no database to resolve baseline {ref!r} in")
    run_id = resolve_run(con, ref)
    desc = f"run {run_id}" if run_id == ref else f"{ref} (run {run_id})"
    return load_side(con, run_id), desc


def candidate_run(con: duckdb.DuckDBPyConnection, ref: str | None, exclude: str | None) -> str:
    """The given run (label or id), else the newest run that is not the baseline."""
    if ref:
        return resolve_run(con, ref)
    row = con.execute(
        "SELECT run_id FROM runs WHERE run_id IS DISTINCT FROM ? ORDER BY created_at DESC, run_id DESC LIMIT 1",
        [exclude],
    ).fetchone()
    if not row:
        raise MoelabError("no run to check: the database holds no run other than the baseline")
    return str(row[0])
