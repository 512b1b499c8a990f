"""`moelab compare` on a terminal or for a script: the layout that fits the width, or CSV, JSON, Markdown.

Wide (120 columns and more, where it fits): one row per (case, op, SMs), one column group per backend.
Narrow (below 120, or where the wide one does not fit): one row per backend under each (case, op, SMs).
Backend names are printed whole where they fit, else as letters with a legend; names and figures are
never cut short: a layout is chosen only where rich can lay it out without breaking a word.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable

from rich import box
from rich.console import Console
from rich.table import Table

from moelab.cli.fit import keep_words_whole, unbroken
from moelab.core.display import safe_text
from moelab.reports import compare as cmp
from moelab.reports.compare_layout import Layout, layout, records

FORMATS = ("table", "csv", "json", "md")
WIDE_FROM = 120  # columns: below this the narrow layout, as the readers asked
FIGURES = (("time", "median"), ("gbps", "GB/s"), ("peak", "% peak"), ("bound", "% bound"))


def _names(view: Layout, letters: bool) -> dict[str, str]:
    return {g: view.keys[g] if letters else g for g in view.groups}


def _has_case(view: Layout) -> bool:
    """A case column only where the cases differ (the words they share are said above the table)."""
    return any(row.case != "—" for row in view.rows)


def _table(view: Layout) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    if _has_case(view):
        table.add_column("case", overflow="fold")
    return table


def _wide(view: Layout, letters: bool) -> Table:
    names = _names(view, letters)
    table = _table(view)
    table.add_column("op", no_wrap=True, overflow="fold")
    table.add_column("SMs", no_wrap=True, overflow="fold")
    for g in view.groups:
        for _, head in FIGURES:
            table.add_column(f"{names[g]} {head}", justify="right", no_wrap=True, overflow="fold")
        if g != view.reference:
            table.add_column(f"{names[g]} vs {names[view.reference]}", overflow="fold")
    for row in view.rows:
        cells = [row.case, row.op, row.sms] if _has_case(view) else [row.op, row.sms]
        for g in view.groups:
            f = row.figures.get(g)
            cells += [getattr(f, attr) if f else "—" for attr, _ in FIGURES]
            if g != view.reference:
                cells.append(f.versus if f else "—")
        table.add_row(*(safe_text(c) for c in cells))
    return table


def _narrow(view: Layout, letters: bool) -> Table:
    names = _names(view, letters)
    table = _table(view)
    table.add_column("op", overflow="fold")
    table.add_column("SMs", no_wrap=True, overflow="fold")
    table.add_column("backend" if not letters else "", overflow="fold")
    for _, head in FIGURES:
        table.add_column(head, justify="right", no_wrap=True, overflow="fold")
    table.add_column(f"vs {names[view.reference]}", overflow="fold")
    for row in view.rows:
        first = True
        for g in view.groups:
            f = row.figures.get(g)
            if f is None:
                continue
            lead = [row.case, row.op, row.sms] if _has_case(view) else [row.op, row.sms]
            lead = lead if first else [""] * len(lead)
            cells = [*lead, names[g], *(getattr(f, attr) for attr, _ in FIGURES), f.versus]
            table.add_row(*(safe_text(c) for c in cells))
            first = False
        if table.rows:
            table.rows[-1].end_section = True  # a rule under each (case, op, SMs)
    return table


def fitting_table(view: Layout, console: Console) -> tuple[Table, bool]:
    """The first layout that fits the console's width without breaking a word, and whether it names
    backends by letter; the narrow one with letters where none fits (a terminal narrower than its
    longest figure)."""
    candidates: list[tuple[Callable[[Layout, bool], Table], bool]] = []
    if console.width >= WIDE_FROM:
        candidates += [(_wide, False), (_wide, True)]
    candidates += [(_narrow, False), (_narrow, True)]
    for build, letters in candidates:
        table = keep_words_whole(build(view, letters))
        if unbroken(table, console):
            return table, letters
    return table, letters


def print_compare(console: Console, table: cmp.CompareTable, title: str) -> None:
    """The answer, the shared workload, the table that fits, then the legend."""
    view = layout(table)
    for line in view.answer:
        console.print(safe_text(line))
    console.print(safe_text(title + (f"; every case: {view.shared}" if view.shared else "")))
    rich_table, letters = fitting_table(view, console)
    console.print(rich_table)
    if letters:
        for g in view.groups:
            console.print(
                safe_text(f"{view.keys[g]} = {g}" + (" (reference)" if g == view.reference else ""))
            )


def as_text(table: cmp.CompareTable, fmt: str) -> str:
    """CSV or JSON: one record per (case, op, SMs, group) with raw figures; Markdown: the wide layout."""
    if fmt == "json":
        return json.dumps(records(table), indent=2)
    if fmt == "csv":
        rows = records(table)
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return out.getvalue()
    view = layout(table)
    head = ["case", "op", "SMs"]
    for g in view.groups:
        head += [f"{g} {h}" for _, h in FIGURES]
        if g != view.reference:
            head.append(f"{g} vs {view.reference}")
    lines = [*view.answer, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in view.rows:
        cells = [row.case, row.op, row.sms]
        for g in view.groups:
            f = row.figures.get(g)
            cells += [getattr(f, attr) if f else "—" for attr, _ in FIGURES]
            if g != view.reference:
                cells.append(f.versus if f else "—")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if view.shared:
        lines += ["", f"Every case: {view.shared}."]
    return "\n".join(lines) + "\n"
