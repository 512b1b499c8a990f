"""`moelab backends` and `moelab runs`."""

from __future__ import annotations

import typer

from moelab.cli.common import DB_OPTION_HELP, console, print_table, user_errors
from moelab.store.db import open_db, resolve_db_path
from moelab.store.labels import names_by_run


@user_errors
def backends() -> None:
    """List every backend (built-in and plugins) and whether it can run here, or why not.

    Example: moelab backends
    """
    from moelab.backends import registry  # imports the backend base class, and so torch

    rows = []
    for name, entry in registry.entries().items():
        reason = registry.availability(name)
        rows.append((name, "available" if reason is None else "unavailable", reason or "", entry.origin))
    print_table(["backend", "status", "reason", "from"], rows)


@user_errors
def runs(
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    limit: int = typer.Option(20, help="How many of the newest runs to list"),
) -> None:
    """List stored runs, newest first.

    Example: moelab runs --limit 5
    """
    path = resolve_db_path(db)
    if not path.exists():
        console.print(f"no database at {path} yet: `moelab run` creates it")
        return
    with open_db(path, read_only=True) as con:
        rows = con.execute(
            """
            WITH newest AS (SELECT * FROM runs ORDER BY created_at DESC, run_id DESC LIMIT ?)
            SELECT r.run_id, strftime(r.created_at, '%Y-%m-%d %H:%M:%S') AS created, r.label, r.suite, r.status,
                   array_to_string(r.backends, ','), r.device, r.world,
                   count(c.case_id) FILTER (WHERE c.status = 'ok') AS ok_cases,
                   count(c.case_id) FILTER (WHERE c.status IN ('unsupported', 'skipped')) AS not_run,
                   count(c.case_id) FILTER (WHERE c.status NOT IN ('ok', 'unsupported', 'skipped')) AS failed,
                   count(c.case_id) AS cases
            FROM newest r LEFT JOIN cases c USING (run_id)
            GROUP BY ALL ORDER BY created DESC, r.run_id DESC
            """,
            [limit],
        ).fetchall()
        names = names_by_run(con)
    rows = [(r[0], r[1], ", ".join(names.get(r[0], [])) or None, *r[3:]) for r in rows]
    print_table(
        # not run: unsupported here or skipped (an SM count gloo cannot set), which is no failure
        [
            "run",
            "created (UTC)",
            "label",
            "suite",
            "status",
            "backends",
            "device",
            "ranks",
            "ok",
            "not run",
            "failed",
            "cases",
        ],
        rows,
    )
