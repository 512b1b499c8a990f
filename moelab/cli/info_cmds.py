"""`moelab backends` and `moelab runs`."""

from __future__ import annotations

import json

import typer

from moelab.cli import options as opt
from moelab.cli.common import DB_OPTION_HELP, console, print_table, user_errors
from moelab.core.errors import MoelabError
from moelab.store.db import open_db, resolve_db_path
from moelab.store.labels import names_by_run

CHECK = opt.Flag(
    "check",
    str | None,
    None,
    ("--check",),
    "Check backend NAME against the plugin contract (moelab.plugin) before any run: one line per problem, "
    "exit 1 when there is one",
    metavar="NAME",
)
JSON_OUT = opt.Flag(
    "as_json", bool, False, ("--json",), "Print the list as JSON (name, available, reason, from)"
)


@user_errors
@opt.command(CHECK, opt.BackendOptions.flag("backend_path"), JSON_OUT, panels=False)
def backends(backends: opt.BackendOptions, check: str | None, as_json: bool) -> None:
    """List every backend (built-in and plugins) and whether it can run here, or why not.

    A library built outside the environment counts with --backend-path NAME=DIR, as in `moelab run`.

    Example: moelab backends --check my-ep; moelab backends --backend-path deepep=ext/deepep-v1 --json
    """
    from moelab.backends import registry  # imports the backend base class, and so torch

    if check is not None:
        _check(check)
        return
    paths = backends.paths()
    rows = []
    for name, entry in registry.entries().items():
        reason = registry.availability(name, paths.get(name))
        rows.append((name, "available" if reason is None else "unavailable", reason or "", entry.origin))
    if as_json:
        keys = ("name", "available", "reason", "from")
        typer.echo(
            json.dumps(
                [dict(zip(keys, (n, s == "available", r or None, o), strict=True)) for n, s, r, o in rows]
            )
        )
        return
    print_table(["backend", "status", "reason", "from"], rows)


def _check(name: str) -> None:
    from moelab.backends import contract

    found = contract.check(name)
    for problem in found:
        print(f"{name}: {problem}")
    if found:
        raise typer.Exit(1)
    print(f"{name}: holds the plugin contract")


MAX_LISTED_RUNS = 100_000  # the most runs `moelab runs` lists (db query and compare read more)


@user_errors
def runs(
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    limit: int = typer.Option(20, help="How many of the newest runs to list"),
) -> None:
    """List stored runs, newest first.

    Example: moelab runs --limit 5
    """
    if not 1 <= limit <= MAX_LISTED_RUNS:  # a negative or huge count reached DuckDB's LIMIT as given
        raise MoelabError(f"--limit must be a whole number from 1 to {MAX_LISTED_RUNS:,}, got {limit}")
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
