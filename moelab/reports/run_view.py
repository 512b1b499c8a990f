"""A stored run as the console shows it after `moelab run`: the result rows annotated as the report
annotates them (link peak from what the machine reported, % measured, % bound, flags) and the summary
rows, without drawing anything."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from moelab.model.links import PeakTable
from moelab.reports import bounds, flags, hardware, query, sections, summary
from moelab.store.run_history import not_judged


@dataclass(kw_only=True, slots=True)
class RunView:
    results: list[dict[str, Any]]
    summary_rows: list[summary.SummaryRow]
    flag_groups: list[flags.FlagGroup] = field(default_factory=list)  # of the measured cases
    notes: list[str] = field(default_factory=list)


def load_view(
    con: duckdb.DuckDBPyConnection, run_id: str, peaks: PeakTable | None = None, judged_note: bool = True
) -> RunView:
    """`judged_note`: add the note on drift not judged (it asks the backend classes, so it imports torch;
    the gate's above-bound flags need only the annotated rows)."""
    peaks = peaks or PeakTable()
    query.select_runs(con, [run_id])
    results, environment = query.results(con), query.environment(con)
    links = hardware.job_links(query.health_snapshots(con), environment, peaks)
    sections.annotate_results(results, links)
    bounds.annotate_bounds(results, environment, peaks, links)
    _, knees = sections.sm_sweeps(results, [], draw=False)
    rows = summary.build(results, knees, processes=query.process_medians(con))
    notes = summary.notes(rows)
    judged = not_judged(con, run_id) if judged_note else None
    groups = flags.result_flags(results, several_runs=False).build()
    return RunView(
        results=results, summary_rows=rows, flag_groups=groups, notes=notes + ([judged] if judged else [])
    )
