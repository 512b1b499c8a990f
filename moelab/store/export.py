"""Export runs to files (one per table, plus a versioned manifest) and read such exports back."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from moelab.core.errors import MoelabError
from moelab.store.schema import EXPORT_TABLES, LATEST_VERSION

EXPORT_VERSION = 1
FORMATS = {"parquet": "(FORMAT PARQUET)", "csv": "(FORMAT CSV, HEADER)", "json": "(FORMAT JSON, ARRAY true)"}


def export_runs(con: duckdb.DuckDBPyConnection, out: Path, fmt: str, run_ids: list[str] | None) -> list[Path]:
    if fmt not in FORMATS:
        raise MoelabError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    known = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    if run_ids:
        missing = [r for r in run_ids if r not in known]
        if missing:
            raise MoelabError(f"no such run(s): {', '.join(missing)}")
    selected = sorted(run_ids or known)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MoelabError(f"cannot create {out}: {exc}") from exc
    written = []
    for table in EXPORT_TABLES:
        path = out / f"{table}.{fmt}"
        # run ids are checked against the table above; the list is bound through a temp table, not formatted in
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _export_ids AS SELECT UNNEST(?::VARCHAR[]) AS run_id", [selected]
        )
        con.execute(
            f"COPY (SELECT t.* FROM {table} t SEMI JOIN _export_ids USING (run_id)) TO '{_quote(path)}' {FORMATS[fmt]}"
        )
        written.append(path)
    manifest = {
        "export_version": EXPORT_VERSION,
        "schema_version": LATEST_VERSION,
        "format": fmt,
        "runs": selected,
        "tables": list(EXPORT_TABLES),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    written.append(out / "manifest.json")
    return written


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def load_export(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """Insert an export folder's runs into `con` (e.g. an in-memory database); returns their run ids."""
    manifest_path = folder / "manifest.json"
    if not manifest_path.exists():
        raise MoelabError(f"{folder} is not a moelab export (no manifest.json)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MoelabError(f"{folder}: manifest.json is not a moelab export manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("export_version") != EXPORT_VERSION:
        found = manifest.get("export_version") if isinstance(manifest, dict) else None
        raise MoelabError(f"{folder}: export version {found} is not {EXPORT_VERSION}")
    fmt = manifest.get("format")
    readers = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}
    tables, runs = manifest.get("tables"), manifest.get("runs")
    if fmt not in readers or not isinstance(tables, list) or not isinstance(runs, list):
        raise MoelabError(f"{folder}: manifest.json lacks a known format, a table list or a run list")
    reader = readers[fmt]
    for table in tables:
        if table not in EXPORT_TABLES:
            raise MoelabError(f"{folder}: manifest names an unknown table {table!r}")
        path = folder / f"{table}.{fmt}"
        if not path.exists():
            raise MoelabError(f"{folder}: {path.name} is missing")
        if fmt == "json":
            # typed columns: an empty table or sparse rows must not change types or invent keys
            cols = con.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
                [table],
            ).fetchall()
            spec = "{" + ", ".join(f"'{c}': '{t}'" for c, t in cols) + "}"
            con.execute(
                f"INSERT INTO {table} BY NAME SELECT * FROM read_json('{_quote(path)}', format='array', columns={spec})"
            )
        else:
            try:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {reader}('{_quote(path)}')")
            except duckdb.Error as exc:
                raise MoelabError(
                    f"{path}: not a readable {fmt} export table ({str(exc).splitlines()[0]})"
                ) from None
    return list(runs)
