"""`moelab db query`, `moelab db export` and `moelab db import`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from moelab.cli.common import DB_OPTION_HELP, console, fail, parse_list, print_table, user_errors
from moelab.core.errors import MoelabError
from moelab.store.db import migrate_file, open_db, query_connection, resolve_db_path
from moelab.store.export import check_export, export_runs, import_export
from moelab.store.labels import resolve_run
from moelab.store.user_query import ROW_CAP, run_query

QUERY_INTERRUPTED = "query interrupted (Ctrl-C); the store is as it was"

app = typer.Typer(
    help='Query and export the DuckDB store.\n\nExample: moelab db query "SELECT run_id, label FROM runs"',
    no_args_is_help=True,
)


@app.command("query")
@user_errors
def query(
    sql: str = typer.Argument(..., help="SQL to run"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    write: bool = typer.Option(
        False, "--write", help="Open read-write (default read-only, so a query cannot damage stored runs)"
    ),
) -> None:
    """Run SQL against the store and print the result as a table.

    Without --write the query cannot change anything: the file is opened read-only, with no access to other
    files (no COPY ... TO, ATTACH or read_csv of a path) and no extensions.

    Example: moelab db query "SELECT backend, op, median_us FROM results ORDER BY median_us"
    """
    path = resolve_db_path(db)
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    try:
        con = query_connection(path, write)
    except KeyboardInterrupt:  # Ctrl-C while the store opens: the same answer as during the query
        raise fail(QUERY_INTERRUPTED, code=130) from None
    try:
        try:
            result = run_query(con, sql)
        except KeyboardInterrupt:
            raise fail(QUERY_INTERRUPTED, code=130) from None
        if result.columns is None:
            console.print("ok")
            return
        print_table(result.columns, result.rows)
        if result.cut:
            print(
                f"warning: the query returns more than {ROW_CAP:,} rows: the first {ROW_CAP:,} are shown "
                "(page with LIMIT ... OFFSET ..., or narrow it)",
                file=sys.stderr,
            )
    finally:
        con.close()


@app.command("migrate")
@user_errors
def migrate_db(db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP)) -> None:
    """Bring a database written by an older moelab to this moelab's schema (reports, compare and check
    read a database as it is, and ask for this first).

    Example: moelab db migrate --db old.duckdb
    """
    path = resolve_db_path(db)
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    before, after = migrate_file(path)
    if before == after:
        console.print(f"database {path} is already at schema version {after}: nothing to do")
    else:
        console.print(f"database {path} migrated from schema version {before} to {after}")


@app.command("export")
@user_errors
def export(
    out: Path = typer.Option(
        ..., "--out", "-o", help="Folder to write one file per table into, plus manifest.json"
    ),
    fmt: str = typer.Option("parquet", "--format", help="parquet, csv or json"),
    run: list[str] = typer.Option(
        [], "--run", help="Run ids or labels to export, repeated or comma-separated (default: all)"
    ),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    force: bool = typer.Option(
        False, "--force", help="Replace --out whole even when it holds files moelab did not write there"
    ),
) -> None:
    """Export runs (every table, filtered by run) to Parquet, CSV or JSON files.

    Example: moelab db export --format parquet --out results/h200x2 --run 20261122T070000Z-abc123
    """
    path = resolve_db_path(db)
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        names = [r for item in run for r in parse_list(item, name="run") or []]
        ids = list(dict.fromkeys(resolve_run(con, r) for r in names))
        written = export_runs(con, out, fmt, ids or None, force=force, db_path=path)
    for p in written:
        console.print(str(p))


@app.command("import")
@user_errors
def import_(
    folder: Path = typer.Argument(
        ..., help="An export folder (moelab db export): one file per table and manifest.json"
    ),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Import an export's runs into a database, so that compare, check and runs read them like any other.

    The database is created where there is none; a run it holds already is never imported twice.

    Example: moelab db import results/h200x2/export --db h200.duckdb && moelab compare --db h200.duckdb
    """
    path = resolve_db_path(db)
    check_export(folder)  # before the store is created or migrated: a refused folder changes nothing
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_db(path) as con:
        ids = import_export(con, folder)
    console.print(f"imported {len(ids)} run{'s' if len(ids) != 1 else ''} from {folder} into {path}")
