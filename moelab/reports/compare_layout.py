"""A comparison table laid out for reading: the answer first, then one row per (case, op, SMs).

`moelab.reports.compare` builds the table and ranks; this module only arranges it. Case labels lose the
workload words every row shares (said once, above the table), backends get a one-letter key where their
names are long (said once, in a legend), and every figure is text with its unit, so a terminal, a
Markdown file or a script reads the same numbers. The ranking is `compare.rank`'s, never redone here.
"""

from __future__ import annotations

import string
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from moelab.core.display import format_number, format_pct, format_time_us
from moelab.core.e2e_spec import LAYER_NAME
from moelab.reports import compare as cmp


@dataclass(frozen=True, kw_only=True, slots=True)
class Figures:
    """One backend's figures for one row, as printed; `versus` is the ratio against the reference with
    its interval and verdict (empty for the reference itself)."""

    time: str
    gbps: str
    peak: str
    bound: str
    versus: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutRow:
    case: str  # the words of the case label that not every row shares
    op: str
    sms: str
    figures: dict[str, Figures]  # group -> its figures; a group that did not measure the row is absent


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    answer: list[str]  # per op: the fastest, by how much, with its interval
    shared: str  # the case words every row shares
    groups: list[str]
    keys: dict[str, str]  # group -> its short key (A, B, ...)
    reference: str
    rows: list[LayoutRow]


def shared_words(labels: list[str]) -> list[str]:
    """The words present in every label, in the first label's order."""
    if not labels:
        return []
    common = set(labels[0].split())
    for label in labels[1:]:
        common &= set(label.split())
    return [w for w in labels[0].split() if w in common]


def short_keys(groups: list[str]) -> dict[str, str]:
    """A, B, ... Z, then AA, AB, ...: a key per group in table order."""
    letters = string.ascii_uppercase
    out = {}
    for i, g in enumerate(groups):
        out[g] = (
            letters[i] if i < len(letters) else letters[i // len(letters) - 1] + letters[i % len(letters)]
        )
    return out


def versus_text(table: cmp.CompareTable, row: cmp.CompareRow, group: str) -> str:
    """`0.697× [0.68, 0.71] slower`: bandwidth over the reference's, its interval, the verdict in time."""
    if group == table.reference or group not in row.cells:
        return ""
    ratio, interval, ranking = (
        table.ratio(row, group),
        table.ratio_interval(row, group),
        table.ranking(row, group),
    )
    parts = [f"{ratio:.3g}×" if ratio is not None else "—"]
    if interval is not None:
        parts.append(interval.text())
    if ranking is not None:
        parts.append(ranking.verdict)
    return " ".join(parts)


def _figures(table: cmp.CompareTable, row: cmp.CompareRow, group: str, cell: cmp.Cell) -> Figures:
    return Figures(  # the time carries the cell's marks (unstable, suspect, contended), as run's tables do
        time=format_time_us(cell.median_us) + (f" {cell.marks}" if cell.marks else ""),
        gbps=format_number(cell.gbps, 3),
        peak=format_pct(cell.frac_peak),
        bound=format_pct(cell.frac_bound),
        versus=versus_text(table, row, group),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Lead:
    """In one row: the fastest group, the next, and `compare.rank` of the next against the fastest."""

    first: str
    second: str
    margin: float  # the next's median time over the fastest's
    ranking: cmp.Ranking | None

    @property
    def ranked(self) -> bool:
        """A winner only where the interval excludes a tie (never with no interval)."""
        return (
            self.ranking is not None
            and self.ranking.interval is not None
            and self.ranking.verdict == "slower"
        )

    def detail(self) -> str:
        r = self.ranking
        if r is None or r.interval is None:
            return f"{self.margin:.3g}× (no interval: --repeat 3 gives one)"
        return f"{r.ratio:.3g}× {r.interval.text()}, {'ranked' if self.ranked else 'a tie'}"


def leads(table: cmp.CompareTable) -> list[tuple[str, Lead]]:
    """(op, lead) for each row that more than one group measured."""
    out = []
    for row in table.rows:
        # a time not above zero (or NaN, inf) is invalid, as the gate says: it leads nothing (and divided by zero)
        timed = sorted(
            (c.median_us, g)
            for g, c in row.cells.items()
            if c.median_us is not None and 0 < c.median_us < float("inf")
        )
        if len(timed) < 2:
            continue
        (t1, first), (t2, second) = timed[0], timed[1]
        ranking = cmp.rank(row.cells[first], row.cells[second])
        op = f"{row.op} in the {LAYER_NAME}" if row.layer else row.op
        out.append((op, Lead(first=first, second=second, margin=t2 / t1, ranking=ranking)))
    return out


def answer_lines(table: cmp.CompareTable) -> list[str]:
    """Per op, who was fastest and by how much over the next, with the interval where one case says it."""
    by_op: dict[str, list[Lead]] = defaultdict(list)
    for op, lead in leads(table):
        by_op[op].append(lead)
    lines = []
    for op, op_leads in by_op.items():
        if len(op_leads) == 1:
            lead = op_leads[0]
            if lead.ranked:
                lines.append(f"{op}: {lead.first} fastest, ahead of {lead.second} by {lead.detail()}")
            else:  # one ranking rule (moelab.core.ranking): no winner where the interval is missing or covers 1
                lines.append(f"{op}: no winner: {lead.first} over {lead.second} {lead.detail()}")
            continue
        wins: dict[str, int] = defaultdict(int)
        for lead in op_leads:
            wins[lead.first] += 1
        best = max(wins, key=lambda g: wins[g])
        mine = [lead for lead in op_leads if lead.first == best]
        low, high = min(lead.margin for lead in mine), max(lead.margin for lead in mine)
        spread = f"{low:.3g}×" if low == high else f"{low:.3g}× to {high:.3g}×"
        ranked = sum(1 for lead in mine if lead.ranked)
        timed = sum(1 for lead in mine if lead.ranking is not None and lead.ranking.interval is not None)
        tail = (
            f"the interval excludes a tie in {ranked} of them"
            if timed
            else "no interval (--repeat 3 gives one), so not ranked"
        )
        lines.append(
            f"{op}: {best} fastest in {wins[best]} of {len(op_leads)} cases, ahead of the next by {spread}; {tail}"
        )
    return lines


def layout(table: cmp.CompareTable) -> Layout:
    labels = [row.label for row in table.rows]
    shared = shared_words(labels)
    rows = []
    for row in table.rows:
        words = [w for w in row.label.split() if w not in shared]
        rows.append(
            LayoutRow(
                case=" ".join(words) or "—",
                op=row.op,
                sms=str(row.sms) if row.sms is not None else "default",
                figures={g: _figures(table, row, g, c) for g, c in row.cells.items()},
            )
        )
    return Layout(
        answer=answer_lines(table),
        shared=" ".join(shared),
        groups=list(table.groups),
        keys=short_keys(table.groups),
        reference=table.reference,
        rows=rows,
    )


def records(table: cmp.CompareTable) -> list[dict[str, Any]]:
    """One record per (case, op, SMs, group), raw figures, for scripts (`--format csv|json`)."""
    out = []
    for row in table.rows:
        for g in table.groups:
            c = row.cells.get(g)
            if c is None:
                continue
            ranking = table.ranking(row, g) if g != table.reference else None
            interval = table.ratio_interval(row, g) if g != table.reference else None
            out.append(
                {
                    "case": row.label,
                    "op": row.op,
                    "sms": row.sms,
                    table.by: g,
                    "run_id": c.run_id,
                    "median_us": c.median_us,
                    "gbps": c.gbps,
                    "frac_peak": c.frac_peak,
                    "frac_bound": c.frac_bound,
                    "reference": table.reference,
                    "ratio": table.ratio(row, g) if g != table.reference else None,
                    "ratio_low": interval.low if interval else None,
                    "ratio_high": interval.high if interval else None,
                    "verdict": ranking.verdict if ranking else None,
                }
            )
    return out
