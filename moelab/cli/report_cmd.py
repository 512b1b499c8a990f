"""`moelab report`."""

from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.common import DB_OPTION_HELP, console, user_errors
from moelab.reports.html import write_report
from moelab.store.db import resolve_db_path


@user_errors
def report(
    run: list[str] = typer.Option([], "--run", help="Run id(s) (default: the newest run)"),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="File to write"),
    fmt: str = typer.Option("html", "--format", help="html (self-contained, opens offline) or md (for PRs)"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Render a report of one or more runs: environment, SM-vs-bandwidth charts, results table.

    Example: moelab report --run 20261122T070000Z-abc123 -o report.html
    """
    path = write_report(resolve_db_path(db), run or None, out, fmt)
    console.print(f"report: {path}")
