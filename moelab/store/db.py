"""Opening the DuckDB file: default location, lock waits, migrations, one clear error when it cannot."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import platformdirs

from moelab.core.definitions import DEFINITIONS, FORMAT_DEFINITIONS
from moelab.core.display import safe_text
from moelab.core.errors import MoelabError
from moelab.core.ops import OPS
from moelab.store.schema import LATEST_VERSION, MIGRATIONS, views_at

LOCK_WAIT_S = 60.0
Config = dict[str, str | bool | int | float | list[str]]
# Every connection: DuckDB never downloads or loads an extension by itself (a SQLite file given as --db
# would otherwise make it fetch sqlite_scanner from the network).
BASE_CONFIG: Config = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
# `moelab db query` without --write: besides the read-only open, no file outside the database (COPY ... TO,
# ATTACH of another file or of a hard link to this one, read_csv of any path), no extension, and the
# settings locked so that the query cannot turn them back on (DuckDB's "Securing DuckDB" guide).
QUERY_CONFIG: Config = BASE_CONFIG | {
    "enable_external_access": False,
    "lock_configuration": True,
}


def data_dir() -> Path:
    return Path(platformdirs.user_data_dir("moelab", appauthor=False))


def default_db_path() -> Path:
    return data_dir() / "moelab.duckdb"


def resolve_db_path(cli_value: str | None) -> Path:
    """--db wins, then MOELAB_DB, then the user's data directory."""
    if cli_value:
        return Path(cli_value).expanduser()
    env = os.environ.get("MOELAB_DB")
    return Path(env).expanduser() if env else default_db_path()


def _connect_once(path: Path, read_only: bool, config: Config) -> duckdb.DuckDBPyConnection:
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    return duckdb.connect(str(path), read_only=read_only, config=config)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _open(path: Path, read_only: bool, lock_wait_s: float, config: Config) -> duckdb.DuckDBPyConnection:
    """A connection, waiting while another process holds the file's lock; one-line MoelabError otherwise."""
    if read_only and not path.exists():
        raise MoelabError(f"no database at {path}")
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            return _connect_once(path, read_only, config)
        except (duckdb.IOException, OSError) as exc:
            msg = _first_line(exc)
            if "lock" in msg.lower() and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise MoelabError(f"cannot open database {path}: {_why_unopenable(msg)}") from exc
        except duckdb.Error as exc:
            raise MoelabError(f"cannot open database {path}: {_why_unopenable(_first_line(exc))}") from exc


def _why_unopenable(msg: str) -> str:
    if (
        "sqlite_scanner" in msg
        or "Install it first" in msg
        or "Loading external extensions is disabled" in msg
    ):
        return "it is not a DuckDB database (a SQLite file?); moelab never installs DuckDB extensions"
    return msg


def connect(
    path: Path, read_only: bool = False, lock_wait_s: float = LOCK_WAIT_S
) -> duckdb.DuckDBPyConnection:
    """Open (and, read-write, create and migrate) the database; waits while another moelab holds the lock.

    Read-only (reports, compare, check, queries) nothing is migrated: a database of an older moelab is
    refused with one line naming the command that migrates it, never read with a schema it lacks. A write
    command that migrates an older moelab's store says so once: that moelab cannot open the file after."""
    con = _open(path, read_only, lock_wait_s, BASE_CONFIG)
    try:
        check_complete(con, path)
        if not read_only:
            before = current_version(con)
            after = migrate(con, path)
            if 0 < before < after:
                print(safe_text(migrated_note(path, before, after)), file=sys.stderr)
        else:
            check_version(con, path)
    except duckdb.Error as exc:  # a file that opens but cannot be read through (truncated, damaged)
        con.close()
        raise MoelabError(f"cannot use database {path}: {_first_line(exc)}") from exc
    except BaseException:
        con.close()
        raise
    return con


HEADER_BYTES = 3 * 4096  # DuckDB's file: a main header and two database headers, then the blocks


def wal_path(path: Path) -> Path:
    """DuckDB's write-ahead log beside the database file `path`: part of the store until checkpointed."""
    return Path(f"{path}.wal")


def check_complete(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A file cut short (a copy that stopped, a full disk) opens, and fails only when a query reaches a
    missing block, after `moelab run` has measured. The blocks in use must be in the file: a file shorter
    than its headers plus its used blocks is cut. (Checked without a WAL beside it: blocks replayed from a
    WAL are in memory only; a trailing free block may be cut off by DuckDB itself.)"""
    if not path.is_file() or wal_path(path).exists():
        return
    row = con.execute(
        "SELECT block_size, used_blocks FROM pragma_database_size() WHERE database_name = current_database()"
    ).fetchone()
    if row is None:
        return
    need = HEADER_BYTES + int(row[0]) * int(row[1])
    have = path.stat().st_size
    if have < need:
        raise MoelabError(
            f"database {path} is truncated: {have} bytes, its blocks in use need {need} "
            "(restore it from a copy; run directories can be ingested again into a new one)"
        )


def check_version(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """The schema version of a database opened read-only, or a one-line MoelabError when this moelab cannot
    read it as it is (not a moelab database, an older schema, a newer one)."""
    try:
        version = current_version(con)
    except duckdb.Error as exc:
        raise MoelabError(f"cannot read database {path}: {_first_line(exc)}") from exc
    if version > LATEST_VERSION:
        raise MoelabError(
            f"database {path} has schema version {version}, newer than this moelab ({LATEST_VERSION}): upgrade moelab"
        )
    if version == 0:
        raise MoelabError(f"{path} is not a moelab database (no schema_version table)")
    if version < LATEST_VERSION:
        raise MoelabError(
            f"database {path} has schema version {version}, older than this moelab ({LATEST_VERSION}): "
            f"migrate it with `moelab db migrate --db {path}` (a copy first, if older moelabs still use it)"
        )
    return version


def migrate_file(path: Path) -> tuple[int, int]:
    """`moelab db migrate`: the schema version of the database before and after applying the migrations."""
    con = _open(path, False, LOCK_WAIT_S, BASE_CONFIG)
    try:
        check_complete(con, path)
        before = current_version(con)
        after = migrate(con, path)
    except duckdb.Error as exc:
        raise MoelabError(f"cannot migrate database {path}: {_first_line(exc)}") from exc
    finally:
        con.close()
    return before, after


def query_connection(path: Path, write: bool) -> duckdb.DuckDBPyConnection:
    """The connection `moelab db query` runs a user's SQL on: read-write and migrated with --write; else
    read-only with no access outside the file and its settings locked (QUERY_CONFIG)."""
    if write:
        return connect(path)
    con = _open(path, True, LOCK_WAIT_S, QUERY_CONFIG)
    try:
        check_complete(con, path)
        check_version(con, path)
    except BaseException:
        con.close()
        raise
    return con


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection, what: str) -> Iterator[None]:
    """BEGIN ... COMMIT, rolled back on any failure. A COMMIT that fails (a full disk) has already ended the
    transaction: the ROLLBACK after it fails too, and must not replace the first error, which names the
    cause (`No space left on device`)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        if isinstance(exc, duckdb.Error):
            raise MoelabError(f"{what} failed, nothing was stored: {_first_line(exc)}") from exc
        raise


@contextmanager
def open_db(path: Path, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect(path, read_only=read_only)
    try:
        yield con
    finally:
        con.close()


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """A table or view of that name; a database opened read-only is not migrated, so an older one may lack a
    later table."""
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
    ).fetchone()
    return bool(row and row[0])


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """As has_table, for a column added by a later migration."""
    row = con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [table, column],
    ).fetchone()
    return bool(row and row[0])


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    if not has_table(con, "schema_version"):
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _user_tables(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_name <> 'schema_version'"
    ).fetchone()
    return int(row[0]) if row else 0


def migrate(con: duckdb.DuckDBPyConnection, path: Path | None = None) -> int:
    """Apply every migration newer than the database, each in its own transaction, and recreate the views
    after each (moelab.store.schema: DuckDB 1.x keeps a view bound to a table's columns of before an ALTER).
    A DuckDB file that holds other tables and no schema_version is someone else's database: refused, never
    written into."""
    if current_version(con) == 0 and _user_tables(con):
        raise MoelabError(
            f"{path or 'the database'} is not a moelab database (it has tables, no schema_version)"
        )
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, description VARCHAR, applied_at TIMESTAMP DEFAULT now())"
    )
    version = current_version(con)
    if version > LATEST_VERSION:
        raise MoelabError(
            f"database schema version {version} is newer than this moelab ({LATEST_VERSION}): upgrade moelab"
        )
    for m in MIGRATIONS:
        if m.version <= version:
            continue
        with transaction(con, f"migrating to schema version {m.version}"):
            for stmt in m.statements:
                con.execute(stmt)
            for view in views_at(m.version):  # bound to the tables as this migration left them
                con.execute(view.create())
            con.execute(
                "INSERT INTO schema_version (version, description) VALUES (?, ?)", [m.version, m.description]
            )
    texts = (
        [(d.name, d.text) for d in DEFINITIONS.values()]
        + [(f"op:{o.name}", o.text) for o in OPS.values()]
        + list(FORMAT_DEFINITIONS.items())
    )
    # only the texts that changed: a store already up to date is opened without a write (DuckDB 1.x
    # writes its WAL for an INSERT OR REPLACE of identical rows, so a full disk failed every open)
    con.execute(
        "INSERT OR REPLACE INTO definitions SELECT * FROM (VALUES "
        + ", ".join(["(?, ?)"] * len(texts))
        + ") EXCEPT SELECT name, text FROM definitions",
        [v for pair in texts for v in pair],
    )
    return current_version(con)


def migrated_note(path: Path, before: int, after: int) -> str:
    return (
        f"note: database {path} migrated from schema version {before} to {after}: an older moelab sharing "
        f"it can no longer open it (it says so and asks to be upgraded)"
    )


def check_writable(path: Path) -> None:
    """Fail before a run starts, not after it measured, when the database cannot be written."""
    with open_db(path):
        pass
