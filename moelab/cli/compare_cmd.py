"""`moelab compare`: cases side by side, grouped by backend, GPU model, a software version, label or run."""

from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.common import DB_OPTION_HELP, console, print_table, user_errors
from moelab.errors import MoelabError
from moelab.reports import compare as cmp
from moelab.reports import query
from moelab.reports.html import render_compare
from moelab.reports.peaks import load_peaks
from moelab.store.db import open_db, resolve_db_path
from moelab.store.labels import resolve_run


@user_errors
def compare(
    by: str = typer.Option("backend", "--by", help=f"Group by: {', '.join(cmp.BY_KEYS)}"),
    run: list[str] = typer.Option(
        [], "--run", help="Run ids or labels (default: the newest run for --by backend, else every run)"
    ),
    metric: str = typer.Option(
        "nvl_recv", "--metric", help=f"Bandwidth definition: {', '.join(cmp.METRICS)}"
    ),
    reference: str | None = typer.Option(
        None, "--reference", help="Group the ratios are taken against (default: the first in order)"
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Also write the comparison as a self-contained HTML page"
    ),
    peaks: Path | None = typer.Option(
        None, "--peaks", help="TOML file of link peaks adding to or replacing the built-in table"
    ),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Compare cases side by side, matched on workload and SMs, with bandwidth as a fraction of each GPU's link peak.

    Example: moelab compare --by gpu --run h100-main --run h200-main --html compare.html
    """
    if by not in cmp.BY_KEYS:
        raise MoelabError(f"cannot compare by {by!r}: choose one of {', '.join(cmp.BY_KEYS)}")
    table_peaks = load_peaks(peaks)
    path = resolve_db_path(db)
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        if run:
            ids = list(dict.fromkeys(resolve_run(con, r) for r in run))
        elif by == "backend":
            ids = query.latest_run_ids(con)
        else:
            ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
        if not ids:
            raise MoelabError(f"no runs in {path}")
        query.select_runs(con, ids)
        table = cmp.build(
            query.results(con),
            query.environment(con),
            query.runs(con),
            table_peaks,
            by=by,
            metric=metric,
            reference=reference,
        )
    if len(table.groups) < 2:
        raise MoelabError(
            f"only one {by} ({', '.join(table.groups) or 'none'}) among runs {', '.join(ids)}: nothing to compare"
        )
    if not table.rows:
        raise MoelabError(f"no case was measured by more than one {by}: nothing to compare")
    print_table(
        table.header(), table.table_rows(), title=f"by {by}: {metric} GB/s, ratios against {table.reference}"
    )
    if html is not None:
        try:
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(render_compare(table, f"moelab compare by {by}"))
        except OSError as exc:
            raise MoelabError(f"cannot write {html}: {exc}") from exc
        console.print(f"html: {html}")
