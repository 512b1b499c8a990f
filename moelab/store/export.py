"""Export runs to files (one per table, plus a versioned manifest) and read such exports back.

An export is written whole into a temporary folder beside its destination and renamed into place, so a
failed export (a full disk) leaves the previous one as it was; the manifest holds each file's size and
SHA-256, so a folder mixing two exports is refused when read.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path

import duckdb

from moelab.core.display import safe_text
from moelab.core.errors import MoelabError
from moelab.job.safe_read import RunDirFileError, read_json
from moelab.store.db import wal_path
from moelab.store.schema import EXPORT_TABLES, LATEST_VERSION

EXPORT_VERSION = 1
FORMATS = {"parquet": "(FORMAT PARQUET)", "csv": "(FORMAT CSV, HEADER)", "json": "(FORMAT JSON, ARRAY true)"}


def export_runs(
    con: duckdb.DuckDBPyConnection,
    out: Path,
    fmt: str,
    run_ids: list[str] | None,
    force: bool = False,
    db_path: Path | None = None,
) -> list[Path]:
    """Write the selected runs' tables into `out`, replacing it whole. `db_path`: the store `con` reads,
    which, with every stored run's directory, must not lie inside `out` (--force would delete it)."""
    if fmt not in FORMATS:
        raise MoelabError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    known = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    if run_ids:
        missing = [r for r in run_ids if r not in known]
        if missing:
            raise MoelabError(f"no such run(s): {', '.join(missing)}")
    _check_replaceable(out, force)
    _check_holds_no_store(con, out, db_path)
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    try:
        tmp.mkdir(parents=True)
        names = _write_tables(con, tmp, fmt, sorted(run_ids or known))
        _replace_folder(tmp, out)
    except (OSError, duckdb.Error) as exc:
        raise MoelabError(
            f"export to {out} failed ({str(exc).strip().splitlines()[0][:300]}); "
            + (
                "the previous export there is unchanged"
                if (out / "manifest.json").exists()
                else "nothing was written"
            )
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out / name for name in names]


def _check_replaceable(out: Path, force: bool) -> None:
    """An export replaces its folder whole: only a folder moelab wrote (an earlier export: its manifest and
    the files that manifest names, nothing else) or an empty one is replaced, unless `force`. A folder
    that merely holds a file called manifest.json beside others is someone else's."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise MoelabError(f"{out} exists and is not a folder")
    if force or not out.is_dir():
        return
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    foreign = [name for name in present if name not in _export_files(out)]
    if foreign:
        shown = ", ".join(safe_text(n) for n in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise MoelabError(
            f"{out} is not a moelab export (it holds {shown}, which moelab did not write there): "
            "give a new or empty folder, or --force to replace it whole"
        )


def _check_holds_no_store(con: duckdb.DuckDBPyConnection, out: Path, db_path: Path | None) -> None:
    """An export replaces `out` whole: refused where the store, its write-ahead log or a stored run's
    directory lies in it (`db export --out <the data folder> --force` deleted the store it had just read)."""
    if not out.exists():
        return
    kept = [] if db_path is None else [db_path, wal_path(db_path)]
    kept += [
        Path(d)
        for (d,) in con.execute("SELECT DISTINCT run_dir FROM runs WHERE run_dir IS NOT NULL").fetchall()
    ]
    folder = out.resolve()
    for path in kept:
        if path.exists() and path.resolve().is_relative_to(folder):
            raise MoelabError(
                f"{out} holds {path}, which the store needs; replacing it whole would delete it: "
                "export into a folder of its own"
            )


def _export_files(folder: Path) -> set[str]:
    """The names an earlier export in `folder` wrote (its manifest and the files the manifest names); empty
    when the folder holds no readable moelab manifest."""
    try:
        manifest = read_json(folder / "manifest.json", cap=64 << 20)
    except RunDirFileError:
        return set()
    if not isinstance(manifest, dict) or manifest.get("export_version") != EXPORT_VERSION:
        return set()
    files, tables, fmt = manifest.get("files"), manifest.get("tables"), manifest.get("format")
    if isinstance(files, dict):
        names = {str(n) for n in files}
    elif isinstance(tables, list) and isinstance(fmt, str):  # written before manifests held hashes
        names = {f"{t}.{fmt}" for t in tables}
    else:
        return set()
    return names | {"manifest.json"}


def _write_tables(con: duckdb.DuckDBPyConnection, folder: Path, fmt: str, selected: list[str]) -> list[str]:
    """Every run table of the selected runs, then the manifest (written last, naming each file's hash)."""
    # run ids are checked against the table first; the list is bound through a temp table, not formatted in
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _export_ids AS SELECT UNNEST(?::VARCHAR[]) AS run_id", [selected]
    )
    files = {}
    for table in EXPORT_TABLES:
        path = folder / f"{table}.{fmt}"
        con.execute(
            f"COPY (SELECT t.* FROM {table} t SEMI JOIN _export_ids USING (run_id)) TO '{_quote(path)}' {FORMATS[fmt]}"
        )
        files[path.name] = _file_facts(path)
    manifest = {
        "export_version": EXPORT_VERSION,
        "schema_version": LATEST_VERSION,
        "format": fmt,
        "runs": selected,
        "tables": list(EXPORT_TABLES),
        "files": files,
    }
    with (folder / "manifest.json").open("w") as fh:
        fh.write(json.dumps(manifest, indent=2))
        fh.flush()
        os.fsync(fh.fileno())
    return [*files, "manifest.json"]


def _file_facts(path: Path) -> dict[str, object]:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _replace_folder(new: Path, out: Path) -> None:
    """`new` becomes `out`; an `out` already there is moved aside first and removed only after."""
    old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
    had_old = out.exists()
    if had_old:
        os.rename(out, old)
    try:
        os.rename(new, out)
    except OSError:
        if had_old:
            os.rename(old, out)
        raise
    if had_old:
        shutil.rmtree(old, ignore_errors=True)


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def load_export(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """Insert an export folder's runs into `con` (e.g. an in-memory database); returns their run ids."""
    manifest_path = folder / "manifest.json"
    try:
        manifest = read_json(manifest_path, cap=64 << 20)
    except RunDirFileError as exc:
        raise MoelabError(f"{folder}: manifest.json is not a moelab export manifest ({exc})") from None
    if manifest is None:
        raise MoelabError(f"{folder} is not a moelab export (no manifest.json)")
    if not isinstance(manifest, dict) or manifest.get("export_version") != EXPORT_VERSION:
        found = manifest.get("export_version") if isinstance(manifest, dict) else None
        raise MoelabError(f"{folder}: export version {found} is not {EXPORT_VERSION}")
    fmt = manifest.get("format")
    readers = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}
    tables, runs = manifest.get("tables"), manifest.get("runs")
    if (
        fmt not in readers
        or not isinstance(tables, list)
        or not isinstance(runs, list)
        or not all(isinstance(r, str) for r in runs)
    ):
        raise MoelabError(f"{folder}: manifest.json lacks a known format, a table list or a run list")
    reader = readers[fmt]
    for table in tables:
        if table not in EXPORT_TABLES:
            raise MoelabError(f"{folder}: manifest names an unknown table {table!r}")
        path = folder / f"{table}.{fmt}"
        if not path.exists():
            raise MoelabError(f"{folder}: {path.name} is missing")
        _check_file(path, manifest.get("files"))
        if fmt == "json":
            # typed columns: an empty table or sparse rows must not change types or invent keys
            cols = con.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
                [table],
            ).fetchall()
            spec = "{" + ", ".join(f"'{c}': '{t}'" for c, t in cols) + "}"
            sql = f"INSERT INTO {table} BY NAME SELECT * FROM read_json('{_quote(path)}', format='array', columns={spec})"
        else:
            sql = f"INSERT INTO {table} BY NAME SELECT * FROM {reader}('{_quote(path)}')"
        try:
            con.execute(sql)
        except duckdb.Error as exc:
            raise MoelabError(
                f"{path}: not a readable {fmt} export table ({str(exc).splitlines()[0]})"
            ) from None
    _check_runs_held(con, folder, runs)
    return list(runs)


def _check_runs_held(con: duckdb.DuckDBPyConnection, folder: Path, runs: list[str]) -> None:
    """Every run the manifest lists is in the export's runs table: a manifest naming a run that none of its
    files hold describes another export (or was edited), and a baseline read from it would be empty."""
    held = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    missing = [r for r in runs if r not in held]
    if missing:
        names = ", ".join(safe_text(r) for r in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise MoelabError(
            f"{folder}: manifest.json lists run(s) {names} that none of its files hold: not read"
        )


def _check_file(path: Path, files: object) -> None:
    """A table file as its manifest describes it (exports written before the manifest held hashes pass)."""
    if files is None:
        return
    facts = files.get(path.name) if isinstance(files, dict) else None
    if not isinstance(facts, dict) or _file_facts(path) != facts:
        raise MoelabError(
            f"{path} does not match the export's manifest.json (changed, or from another export): not read"
        )


def check_export(folder: Path) -> list[str]:
    """The export's run ids, read whole into memory first: a folder that is not a readable export is
    refused before the database it would go into is created or migrated (an older store migrated by an
    import that then refused its folder locked its older moelab out for nothing)."""
    from moelab.store.db import migrate

    mem = duckdb.connect(":memory:")
    try:
        migrate(mem)
        return load_export(mem, folder)
    finally:
        mem.close()


def import_export(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """An export's runs into a stored database, whole or not at all; refused where the database holds one
    of them already (a run is imported once, never twice or merged)."""
    try:
        manifest = read_json(folder / "manifest.json", cap=64 << 20)
    except RunDirFileError:
        manifest = None  # load_export names the problem
    listed = manifest.get("runs") if isinstance(manifest, dict) else None
    if isinstance(listed, list) and listed:
        held = con.execute(
            "SELECT run_id FROM runs WHERE run_id IN (SELECT UNNEST(?::VARCHAR[])) ORDER BY run_id", [listed]
        ).fetchall()
        if held:
            raise MoelabError(
                f"the database holds {len(held)} of this export's runs already ({held[0][0]}"
                f"{', ...' if len(held) > 1 else ''}): nothing imported"
            )
    con.begin()
    try:
        ids = load_export(con, folder)
    except BaseException:
        con.rollback()
        raise
    con.commit()
    return ids
