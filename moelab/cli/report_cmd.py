"""`moelab report`: one run (or a few) in full, or the history of many as trends with detected steps."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from moelab.cli.common import DB_OPTION_HELP, console, parse_list, user_errors
from moelab.cli.output_check import check_outputs
from moelab.core.errors import MoelabError
from moelab.store.db import resolve_db_path

if TYPE_CHECKING:
    from moelab.reports.html import Baseline

AUTO_HISTORY_RUNS = 20  # more runs than this get the history view unless --no-history: the full report
# draws every run's charts (about a second each), the history one chart per series

HISTORY_OPTION = typer.Option(
    None,
    "--history/--no-history",
    help="Trends over many runs: one chart per (backend, op, workload, SMs), steps detected and marked "
    f"(default: when more than {AUTO_HISTORY_RUNS} runs are given)",
)
SINCE_OPTION = typer.Option(
    None,
    "--since",
    help="History from this date (2026-11-01) or span back (30d, 12h, 2w); implies --history",
)
GPU_OPTION = typer.Option(
    None,
    "--gpu",
    help="History on GPUs whose name contains this (e.g. H200; comma-separated); implies --history",
)
BASELINE_OPTION = typer.Option(
    None,
    "--baseline",
    "-B",
    metavar="RUN|LABEL|DIR",
    help="Verdicts of the run's ops against this baseline (moelab check's rule) in the summary",
)


@user_errors
def report(
    run: list[str] = typer.Option(
        [], "--run", help="Run ids or labels, repeated or comma-separated (default: the newest run)"
    ),
    export: Path | None = typer.Option(
        None,
        "--export",
        help="Report on an export folder (moelab db export) instead of the database: all its runs, or --run's",
    ),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="File to write"),
    fmt: str = typer.Option("html", "--format", help="html (self-contained, opens offline) or md (for PRs)"),
    history: bool | None = HISTORY_OPTION,
    since: str | None = SINCE_OPTION,
    label: list[str] = typer.Option([], "--label", help="History of runs with this label; implies --history"),
    backend: str | None = typer.Option(
        None, "--backend", help="History of these backends (comma-separated); implies --history"
    ),
    gpu: str | None = GPU_OPTION,
    metric: str = typer.Option("nvl_recv", "--metric", help="History: the bandwidth definition drawn"),
    x_axis: str = typer.Option("time", "--x", help="History: x axis, run time or runs in order ('run')"),
    baseline: str | None = BASELINE_OPTION,
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Render a report of one run (or several), or the history of many runs as trends with detected steps.

    Example: moelab report --run 20261122T070000Z-abc123 -o report.html

    Example: moelab report --export results/h200x2/export -o h200.html

    Example: moelab report --history --since 30d --backend deepep,nccl-a2a --gpu H200 -o history.html
    """
    run = [r for item in run for r in parse_list(item, name="run") or []]
    if export is not None:
        if db is not None:
            raise MoelabError("--export reads an export folder, --db a database: give one")
        with _export_db(export) as (path, ids):
            _report(path, run or ids, out, fmt, history, since, label, backend, gpu, metric, x_axis, baseline)
        return
    db_path = resolve_db_path(db)
    check_outputs(db_path, {"--out": out})
    _report(db_path, run, out, fmt, history, since, label, backend, gpu, metric, x_axis, baseline)


@contextmanager
def _export_db(folder: Path) -> Iterator[tuple[Path, list[str]]]:
    """An export's runs in a database of their own, in a temporary folder removed afterwards."""
    from moelab.store.db import open_db
    from moelab.store.export import import_export

    with tempfile.TemporaryDirectory(prefix="moelab-export-") as tmp:
        path = Path(tmp) / "export.duckdb"
        with open_db(path) as con:
            ids = import_export(con, folder)
        yield path, ids


def _report(
    path: Path,
    run: list[str],
    out: Path,
    fmt: str,
    history: bool | None,
    since: str | None,
    label: list[str],
    backend: str | None,
    gpu: str | None,
    metric: str,
    x_axis: str,
    baseline: str | None,
) -> None:
    filtered = bool(since or label or backend or gpu)
    if history is False and filtered:
        raise MoelabError(
            "--since, --label, --backend and --gpu select runs for the history view: drop --no-history"
        )
    if history is None and len(run) > AUTO_HISTORY_RUNS:
        console.print(
            f"{len(run)} runs: drawing their history (one chart per series); --no-history for the full report"
        )
        history = True
    if history or filtered:
        selection = HistorySelection(run, since, label, backend, gpu, metric)
        console.print(f"history: {_write_history(path, selection, out, fmt, x_axis)}")
        return
    if metric != "nvl_recv" or x_axis != "time":
        raise MoelabError("--metric and --x apply to the history view: add --history")
    from moelab.reports.html import write_report

    against = _baseline(path, run, baseline) if baseline else None
    ids = [against.run_id] if against else run
    written = write_report(path, ids or None, out, fmt, baseline=against)
    console.print(f"report: {written}")


@dataclass(frozen=True)
class HistorySelection:
    """The runs and series a history view draws, as the flags gave them."""

    runs: list[str]
    since: str | None
    labels: list[str]
    backends: str | None
    gpus: str | None
    metric: str


def _write_history(path: Path, sel: HistorySelection, out: Path, fmt: str, x_axis: str) -> Path:
    from moelab.reports.history import Filters, parse_since, write_history

    filters = Filters(
        since=parse_since(sel.since),
        labels=tuple(sel.labels),
        backends=tuple(parse_list(sel.backends, name="backend") or ()),
        gpus=tuple(parse_list(sel.gpus, name="gpu") or ()),
        runs=tuple(sel.runs),
        metric=sel.metric,
    )
    return write_history(path, filters, out, fmt, x_axis)


def _baseline(path: Path, run: list[str], baseline: str) -> Baseline:
    """The gate's verdicts of one run's ops against `baseline` (a label, a run id or an export folder)."""
    from moelab.gate.baseline import candidate_run, load_baseline
    from moelab.gate.decision import Policy, decide, verdicts_by_case
    from moelab.gate.samples import load_side
    from moelab.reports.html import Baseline
    from moelab.store.db import open_db

    if len(run) > 1:
        raise MoelabError("--baseline holds one run against it: give one --run")
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        base, described = load_baseline(con, baseline)
        cand_id = candidate_run(
            con, run[0] if run else None, exclude=base.run_id if base.where == "database" else None
        )
        if cand_id == base.run_id and base.where == "database":
            raise MoelabError(f"the run and the baseline are the same run ({cand_id})")
        cand = load_side(con, cand_id, leave_out=(base.run_id,))  # as `moelab check` reads it
    result = decide(base, cand, Policy(), described)
    verdicts = {(cand_id, *key): status for key, status in verdicts_by_case(result, cand).items()}
    return Baseline(described=described, run_id=cand_id, verdicts=verdicts)
