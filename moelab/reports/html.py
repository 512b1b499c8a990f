"""`moelab report`: one self-contained HTML file (or Markdown for pull requests) for one or more runs.

Every string from the database goes through jinja2's autoescape; the page carries a Content-Security-Policy
that allows no script at all, so a hostile hostname, label or version string is shown, never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import jinja2
import markupsafe

from moelab.core.display import format_number, format_pct, format_time_us, safe_text
from moelab.core.errors import MoelabError
from moelab.model.links import PeakTable, load_peaks
from moelab.reports import (
    bounds,
    compare,
    compare_layout,
    e2e_section,
    flags,
    hardware,
    query,
    sections,
    summary,
    verification,
)
from moelab.store.db import open_db
from moelab.store.labels import resolve_run
from moelab.store.run_history import not_judged

latest_run_ids = query.latest_run_ids  # kept importable from here: the CLI's run command uses it


@dataclass(kw_only=True, slots=True)
class ReportData:
    runs: list[dict[str, Any]]
    environment: list[dict[str, Any]]
    results: list[dict[str, Any]]
    not_measured: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    definitions: list[dict[str, Any]]
    nodes: list[dict[str, Any]] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    knees: list[dict[str, Any]] = field(default_factory=list)
    fits: list[dict[str, Any]] = field(default_factory=list)
    flag_groups: list[flags.FlagGroup] = field(default_factory=list)
    summary_rows: list[summary.SummaryRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said once under the summary
    baseline: str | None = None  # how the baseline of the verdicts was found
    suspects: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)
    traces: list[dict[str, Any]] = field(default_factory=list)
    case_metrics: list[dict[str, Any]] = field(default_factory=list)
    library_figures: list[dict[str, Any]] = field(default_factory=list)  # moelab verify rows
    e2e: list[dict[str, Any]] = field(default_factory=list)  # e2e_section.build blocks
    failure_ranks: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[compare.CompareTable] = field(default_factory=list)
    peaks_source: str = "built-in"
    above_peak_note: str = flags.ABOVE_PEAK_NOTE
    legend: str = summary.LEGEND
    bound_note: str = bounds.BOUND_NOTE
    bound_sources: list[str] = field(default_factory=list)
    published: list[dict[str, Any]] = field(default_factory=list)  # measured cases beside published rows

    @property
    def bad_jobs(self) -> list[dict[str, Any]]:
        return [j for j in self.jobs if j["status"] != "ok"]

    @property
    def summary_groups(self) -> list[tuple[str, list[summary.SummaryRow]]]:
        return summary.by_workload(self.summary_rows)

    @property
    def absent(self) -> list[str]:
        """What these runs hold none of, said in one line instead of one empty section each."""
        missing = [
            (
                not _swept(self.results, "sms") and not _sms_asked([*self.results, *self.not_measured]),
                "an SM sweep (--sms default,8,16,24)",
            ),
            (not _swept(self.results, "tokens_per_rank"), "a token sweep (--tokens-per-rank 1024,4096)"),
            (not self.traces, "traces (--trace torch or nsys)"),
        ]
        return [text for gone, text in missing if gone]


def _sms_asked(cases: list[dict[str, Any]]) -> bool:
    """Whether some backend of one run was asked for two or more SM counts, measured or not (on CPU the
    counts other than the default are unsupported: a sweep was run, there is none to suggest)."""
    seen: dict[tuple[Any, ...], set[str]] = {}
    for c in cases:
        m = re.search(r"-sm(def|\d+)$", str(c.get("case_id", "")))
        if m:
            seen.setdefault((c.get("run_id"), c.get("backend")), set()).add(m.group(1))
    return any(len(v) > 1 for v in seen.values())


def _swept(results: list[dict[str, Any]], axis: str) -> bool:
    """Whether some backend measured one op of one run at two or more values of `axis`."""
    seen: dict[tuple[Any, ...], set[Any]] = {}
    for r in results:
        seen.setdefault((r["run_id"], r["backend"], r["op"]), set()).add(r[axis])
    return any(len(values) > 1 for values in seen.values())


def load(
    con: duckdb.DuckDBPyConnection,
    run_ids: list[str],
    peaks: PeakTable | None = None,
    trace_base: Path | None = None,
    draw: bool = True,
    baseline: Baseline | None = None,
) -> ReportData:
    """Everything the report shows of `run_ids`; `baseline`: gate verdicts of their ops (the CLI's)."""
    peaks = peaks or PeakTable()
    query.select_runs(con, run_ids)
    env = query.environment(con)
    results = query.results(con)
    data = ReportData(
        runs=query.runs(con),
        environment=env,
        results=results,
        not_measured=query.not_measured(con),
        jobs=query.jobs(con),
        definitions=query.definitions(con),
        suspects=query.suspects(con),
        health=query.health(con),
        traces=sections.trace_links(query.traces(con), trace_base),
        case_metrics=query.case_metrics(con),
        library_figures=verification.library_figures(con),
        peaks_source=peaks.source,
        failure_ranks=query.failure_ranks(con),
    )
    links = hardware.job_links(query.health_snapshots(con), env, peaks)
    data.nodes = sections.nodes_panel(env, links)
    sections.annotate_results(results, links)
    bounds.annotate_bounds(results, env, peaks, links)
    data.bound_sources = bounds.bound_sources(results)
    data.published = bounds.published_beside(results)
    ids: list[int] = []
    sm_charts, data.knees = sections.sm_sweeps(results, ids, draw)
    tok_charts, data.fits = sections.token_sweeps(results, ids, draw)
    data.charts = sm_charts + tok_charts or sections.fallback_bars(results, ids, draw)
    data.comparisons = _comparisons(results, env, data.runs, links, con)
    data.e2e = e2e_section.build(e2e_section.e2e_rows(con), draw)
    several = len(run_ids) > 1
    data.flag_groups = flags.group_flags(results, data.bad_jobs, data.not_measured, data.health, several)
    data.summary_rows = summary.build(
        results, data.knees, baseline.verdicts if baseline else None, query.process_medians(con)
    )
    data.baseline = baseline.described if baseline else None
    data.notes = summary.notes(data.summary_rows) + [
        n for r in data.runs if (n := not_judged(con, r["run_id"], exact=False))
    ]
    return data


@dataclass(frozen=True, kw_only=True, slots=True)
class Baseline:
    """Verdicts of the gate (moelab check's rule) against a baseline, per (run, backend, case, op)."""

    described: str
    run_id: str  # the run held against it
    verdicts: dict[tuple[str, str, str, str], str]


def _comparisons(
    results: list[dict[str, Any]],
    env: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    links: hardware.JobLinks,
    con: duckdb.DuckDBPyConnection,
) -> list[compare.CompareTable]:
    """Backends side by side when there are several; GPU models side by side when runs span several."""
    out = []
    processes = (
        query.process_medians(con) if len({(r["backend"], r["run_id"]) for r in results}) > 1 else None
    )
    for by in ("backend", "gpu"):
        table = compare.build(results, env, runs, links, by=by, processes=processes)
        # the reference: the group that measured the most of the matched cases, so ratios have a base
        best = max(table.groups, key=lambda g: sum(g in row.cells for row in table.rows), default=None)
        if best is not None and best != table.reference:
            table = compare.build(results, env, runs, links, by=by, reference=best, processes=processes)
        if len(table.groups) > 1 and table.rows:
            out.append(table)
    return out


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("moelab.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters["md"] = _md_cell
    env.filters["pct"] = format_pct
    env.filters["us"] = format_time_us
    env.filters["num"] = format_number
    env.filters["wrapid"] = _wrap_id
    env.globals["fmtnum"] = format_number
    env.globals["layout"] = compare_layout.layout
    return env


def _wrap_id(text: Any) -> markupsafe.Markup:
    """A long case id that may break after each '-' (a line break opportunity, nothing visible)."""
    return markupsafe.Markup("-<wbr>").join(markupsafe.escape(safe_text(text)).split("-"))


def _finalize(value: Any) -> Any:
    """Every printed value without control bytes (autoescape covers markup, not ESC or BEL): stored
    labels, reasons and log tails may hold them. Markup (the drawn charts) stays markup."""
    if isinstance(value, markupsafe.Markup):
        return markupsafe.Markup(safe_text(value, keep_newlines=True))
    if isinstance(value, str):
        return safe_text(value, keep_newlines=True)
    return value


def render(data: ReportData, fmt: str = "html") -> str:
    if fmt not in ("html", "md"):
        raise MoelabError(f"unknown report format {fmt!r}: choose html or md")
    env = _env()
    if fmt == "md":
        env.autoescape = False
    template = env.get_template("report.html.j2" if fmt == "html" else "report.md.j2")
    return template.render(d=data)


def render_history(history: Any, fmt: str = "html") -> str:
    """The history view (reports/history.py): steps table, series table, one chart per series."""
    from moelab.core import steps

    if fmt not in ("html", "md"):
        raise MoelabError(f"unknown report format {fmt!r}: choose html or md")
    env = _env()
    if fmt == "md":
        env.autoescape = False
    template = env.get_template("history.html.j2" if fmt == "html" else "history.md.j2")
    return template.render(h=history, min_effect=steps.MIN_EFFECT, min_segment=steps.MIN_SEGMENT)


def render_compare(table: compare.CompareTable, title: str) -> str:
    """A standalone HTML page holding one comparison (`moelab compare --html`)."""
    return _env().get_template("compare.html.j2").render(t=table, title=title)


def _md_cell(v: Any) -> str:
    """Markdown table cells: no pipes or newlines that would break the row, no raw HTML."""
    text = "" if v is None else str(v)
    return (
        text.replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("\r", " ")
        .replace("\n", " ")
    )


def write_report(
    db_path: Path,
    run_ids: list[str] | None,
    out: Path,
    fmt: str = "html",
    peaks_file: Path | None = None,
    baseline: Baseline | None = None,
) -> Path:
    if not db_path.exists():
        raise MoelabError(f"no database at {db_path}")
    peaks = load_peaks(peaks_file)
    with open_db(db_path, read_only=True) as con:
        ids = [resolve_run(con, r) for r in dict.fromkeys(run_ids)] if run_ids else query.latest_run_ids(con)
        if not ids:
            raise MoelabError(f"no runs in {db_path}")
        data = load(con, ids, peaks, trace_base=out.resolve().parent, draw=fmt == "html", baseline=baseline)
    text = render(data, fmt)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise MoelabError(f"cannot write report {out}: {exc}") from exc
    return out
