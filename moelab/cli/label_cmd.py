"""`moelab label`: name a run (a baseline for `moelab check --baseline NAME`)."""

from __future__ import annotations

import typer

from moelab.cli.common import DB_OPTION_HELP, console, print_table, user_errors
from moelab.core.display import safe_text
from moelab.core.errors import MoelabError
from moelab.core.validate import require_text, validate_label
from moelab.reports.query import latest_run_ids
from moelab.store import labels
from moelab.store.db import open_db, resolve_db_path


@user_errors
def label(
    run: str | None = typer.Argument(None, help="Run id, an existing label, or 'latest' (the newest run)"),
    name: str | None = typer.Argument(None, help="The label; moved here if it named another run"),
    remove: str | None = typer.Option(None, "--remove", help="Delete this label"),
    list_: bool = typer.Option(False, "--list", help="List labels"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Give a run a name (moving the name if another run had it), list names, or remove one.

    Example: moelab label latest main
    """
    path = resolve_db_path(db)
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    if list_ or remove:
        if run or name:
            raise MoelabError("--list and --remove take no RUN NAME arguments")
        with open_db(path, read_only=not remove) as con:  # a listing never migrates the store
            if remove:
                console.print(
                    safe_text(f"removed label {remove} (was run {labels.remove_label(con, remove)})")
                )
                return
            print_table(["label", "run", "set at"], labels.list_labels(con))
        return
    if not run or not name:
        raise MoelabError("give RUN and NAME (e.g. moelab label latest main), or --list")
    name = validate_label(name)  # before the database is opened: a name the store cannot hold changes nothing
    require_text(run, "run or label")
    with open_db(path) as con:
        if run == "latest" and not con.execute("SELECT 1 FROM labels WHERE label = 'latest'").fetchone():
            ids = latest_run_ids(con)
            if not ids:
                raise MoelabError(f"no runs in {path}")
            run_id = ids[0]
        else:
            run_id = labels.resolve_run(con, run)
        before = labels.set_label(con, run_id, name)
    moved = f" (moved from run {before})" if before and before != run_id else ""
    console.print(safe_text(f"label {name} -> run {run_id}{moved}"))
