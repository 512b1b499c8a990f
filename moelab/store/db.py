"""Opening the DuckDB file: default location, lock waits, migrations, one clear error when it cannot."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import platformdirs

from moelab.core.definitions import DEFINITIONS, FORMAT_DEFINITIONS
from moelab.core.errors import MoelabError
from moelab.core.ops import OPS
from moelab.store.schema import LATEST_VERSION, MIGRATIONS

LOCK_WAIT_S = 60.0


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


def _connect_once(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    return duckdb.connect(str(path), read_only=read_only)


def connect(
    path: Path, read_only: bool = False, lock_wait_s: float = LOCK_WAIT_S
) -> duckdb.DuckDBPyConnection:
    """Open (and, read-write, create and migrate) the database; waits while another moelab holds the lock."""
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            con = _connect_once(path, read_only)
            break
        except (duckdb.IOException, OSError) as exc:
            msg = str(exc).splitlines()[0]
            if "lock" in msg.lower() and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise MoelabError(f"cannot open database {path}: {msg}") from exc
        except duckdb.Error as exc:
            raise MoelabError(f"cannot open database {path}: {str(exc).splitlines()[0]}") from exc
    if not read_only:
        migrate(con)
    else:
        version = current_version(con)
        if version > LATEST_VERSION:
            con.close()
            raise MoelabError(
                f"database {path} has schema version {version}, newer than this moelab ({LATEST_VERSION}): upgrade moelab"
            )
    return con


@contextmanager
def open_db(path: Path, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect(path, read_only=read_only)
    try:
        yield con
    finally:
        con.close()


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply every migration newer than the database, each in its own transaction."""
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
        con.execute("BEGIN TRANSACTION")
        try:
            for stmt in m.statements:
                con.execute(stmt)
            con.execute(
                "INSERT INTO schema_version (version, description) VALUES (?, ?)", [m.version, m.description]
            )
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    texts = (
        [(d.name, d.text) for d in DEFINITIONS.values()]
        + [(f"op:{o.name}", o.text) for o in OPS.values()]
        + list(FORMAT_DEFINITIONS.items())
    )
    con.execute(
        "INSERT OR REPLACE INTO definitions SELECT * FROM (VALUES "
        + ", ".join(["(?, ?)"] * len(texts))
        + ")",
        [v for pair in texts for v in pair],
    )
    return current_version(con)


def check_writable(path: Path) -> None:
    """Fail before a run starts, not after it measured, when the database cannot be written."""
    with open_db(path):
        pass
