"""`moelab compare`: cases side by side, grouped by backend, GPU model, a software version, label or run."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import typer
from duckdb import DuckDBPyConnection

from moelab.cli.common import DB_OPTION_HELP, PEAKS_OPTION_HELP, console, parse_list, user_errors
from moelab.cli.compare_view import FORMATS, as_text, print_compare
from moelab.cli.output_check import check_outputs
from moelab.core.errors import MoelabError
from moelab.model.links import PeakTable, load_peaks
from moelab.reports import bounds, compare_select, hardware, query
from moelab.reports import compare as cmp
from moelab.store.db import open_db, resolve_db_path
from moelab.store.labels import resolve_run
from moelab.store.starts import missing_starts, partial_notes


def _some(ids: list[str], shown: int = 5) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


@user_errors
def compare(
    by: str = typer.Option("backend", "--by", help=f"Group by: {', '.join(cmp.BY_KEYS)}"),
    run: list[str] = typer.Option(
        [],
        "--run",
        help="Run ids or labels, repeated or comma-separated (default: the newest run for --by backend, else every run)",
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
    peaks: Path | None = typer.Option(None, "--peaks", help=PEAKS_OPTION_HELP),
    groups: int = typer.Option(
        8,
        "--groups",
        min=2,
        help="Groups per page when they are runs (--by run, --by label), the reference included",
    ),
    page: int = typer.Option(1, "--page", min=1, help="Which page of groups to show (--by run, --by label)"),
    max_rows: int = typer.Option(
        200, "--rows", min=1, help="Print at most this many rows (the HTML page holds them all)"
    ),
    fmt: str = typer.Option(
        "table",
        "--format",
        help="table (fits the terminal), or csv, json (one record per backend and case), md",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Compare cases side by side, matched on workload and SMs, with bandwidth as a fraction of each GPU's link peak.

    `% bound` is moelab model's lower-bound time for the case's own topology and backend family over the
    measured time (link figures from the run's measured peaks where it stored them, else the named table).
    Each ratio has its 95% interval over processes (runs with --repeat); the verdict says
    "indistinguishable" where it covers 1 and ranks only where the slowest and fastest ranks agree.

    Example: moelab compare --by gpu --run h100-main --run h200-main --html compare.html
    """
    if by not in cmp.BY_KEYS:
        raise MoelabError(f"cannot compare by {by!r}: choose one of {', '.join(cmp.BY_KEYS)}")
    if fmt not in FORMATS:
        raise MoelabError(f"unknown --format {fmt!r}: choose one of {', '.join(FORMATS)}")
    run = [r for item in run for r in parse_list(item, name="run") or []]
    table_peaks = load_peaks(peaks)
    db_path = resolve_db_path(db)
    check_outputs(db_path, {"--html": html}, {"--peaks": peaks})
    table, paged, ids = _build_table(db_path, run, by, metric, reference, table_peaks, groups, page)
    if len(table.groups) < 2:
        raise MoelabError(
            f"only one {by} ({', '.join(table.groups) or 'none'}) among runs {_some(ids)}: nothing to compare; "
            + _next_step(by, table.groups)
        )
    if not table.rows:
        raise MoelabError(f"no case was measured by more than one {by}: nothing to compare")
    if fmt != "table":
        sys.stdout.write(as_text(table, fmt))
        for note in table.notes:  # stdout holds only the table in its format
            print(note, file=sys.stderr)
        return
    shown = table.rows[:max_rows]
    print_compare(
        console,
        dataclasses.replace(table, rows=shown),
        f"by {by}: {metric} GB/s, ratios against {table.reference}",
    )
    console.print(cmp.INTERVAL_NOTE)
    above = table.findings()
    if above:
        console.print("flags: figures above 100% of their bound or peak, with the likely cause:")
        for line in above:
            console.print(f"  {line}")
    for note in table.notes:
        console.print(note, markup=False, highlight=False)
    if len(table.rows) > max_rows:
        console.print(f"{len(table.rows) - max_rows} more rows not printed (--rows N, or --html for all)")
    if paged is not None and paged.note:
        console.print(paged.note)
    if html is not None:
        _write_html(table, by, html)


def _next_step(by: str, groups: list[str]) -> str:
    """What to do about it: measure a second backend, or name the runs to set side by side."""
    if by == "backend":
        this = groups[0].split()[0] if groups else "NAME"
        return (
            f"measure a second backend (moelab run --backend {this},OTHER; `moelab backends` lists what runs "
            "here) or name runs of other backends (--run ID,ID)"
        )
    return f"name runs that differ in {by} (--run ID,ID), or compare --by backend"


def _run_ids(con: DuckDBPyConnection, run: list[str], by: str) -> list[str]:
    """The runs asked for (ids or labels); by default the newest run for --by backend, else every run."""
    if run:
        return list(dict.fromkeys(resolve_run(con, r) for r in run))
    if by == "backend":
        return query.latest_run_ids(con)
    return [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]


def _build_table(
    path: Path,
    run: list[str],
    by: str,
    metric: str,
    reference: str | None,
    table_peaks: PeakTable,
    groups: int,
    page: int,
) -> tuple[cmp.CompareTable, compare_select.Page | None, list[str]]:
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        ids = _run_ids(con, run, by)
        if not ids:
            raise MoelabError(f"no runs in {path}")
        query.select_runs(con, ids)
        paged = compare_select.page_groups(con, by, reference, groups, page)
        if by != "run":
            label_of = compare_select.label_groups(con) if by == "label" else None
            compare_select.newest_runs_only(con, by, label_of)
        results, environment = query.results(con), query.environment(con)
        links = hardware.job_links(query.health_snapshots(con), environment, table_peaks)
        bounds.annotate_bounds(results, environment, table_peaks, links)
        table = cmp.build(
            results,
            environment,
            query.runs(con),
            links,
            by=by,
            metric=metric,
            reference=reference,
            processes=query.process_medians(con),
        )
        table.notes = partial_notes(missing_starts(con, ids))
    return table, paged, ids


def _write_html(table: cmp.CompareTable, by: str, html: Path) -> None:
    try:
        html.parent.mkdir(parents=True, exist_ok=True)
        from moelab.reports.html import render_compare

        html.write_text(render_compare(table, f"moelab compare by {by}"))
    except OSError as exc:
        raise MoelabError(f"cannot write {html}: {exc}") from exc
    console.print(f"html: {html}")
