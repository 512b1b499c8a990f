"""The console's account of why jobs failed: the cause, and each rank's stack and last log lines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moelab.cli.common import MESSAGE_MAX, console
from moelab.core.display import safe_text
from moelab.store.db import open_db

if TYPE_CHECKING:
    from moelab.reports.flags import FlagGroup

TAIL_SHOWN = 6
SHOWN_MAX = 500  # characters of a stored description on the console; the rest is in the store and on disk


def _capped(text: object, limit: int = SHOWN_MAX) -> str:
    s = str(text or "")
    return s if len(s) <= limit else f"{s[:limit]}… ({len(s) - limit} more characters)"


def failure_lines(con: Any, run_id: str, tail_lines: int = TAIL_SHOWN) -> list[str]:
    """Lines for every failed, crashed or timed-out job of a run: its status and description, the cause
    (`failure_diagnosis.headline`), then per rank the exception, where it was stuck and its last lines."""
    jobs = con.execute(
        "SELECT backend, status, description FROM jobs WHERE run_id = ? AND status NOT IN ('ok', 'unavailable') "
        "ORDER BY backend",
        [run_id],
    ).fetchall()
    out: list[str] = []
    for backend, status, description in jobs:
        out.append(f"[{safe_text(backend)}] {safe_text(status)}: {safe_text(_capped(description))}")
        ranks = con.execute(
            "SELECT rank, exc_type, exc_message, stack_trigger, stack_where, log_tail, headline "
            "FROM failure_diagnosis WHERE run_id = ? AND backend = ? ORDER BY rank",
            [run_id, backend],
        ).fetchall()
        if ranks and ranks[0][6]:
            out.append(f"  cause: {safe_text(_capped(ranks[0][6]))}")
        for rank, exc_type, exc_message, trigger, where, tail, _ in ranks:
            said = []
            if exc_type:
                first = (exc_message or "").strip().splitlines()
                said.append(f"{exc_type}: {first[0][:200]}" if first else exc_type)
            if where:
                said.append(f"{'stuck' if trigger == 'timeout' else 'stack'} at {where}")
            out.append(f"  rank {rank}: {safe_text('; '.join(said)) or 'no exception recorded'}")
            lines = [line for line in (tail or "").splitlines() if line.strip()][-tail_lines:]
            # a rank's line is cut like an error line: one 80,000-character line was printed whole
            out += [f"    | {safe_text(_capped(line, MESSAGE_MAX))}" for line in lines]
    return out


def flag_lines(groups: Sequence[FlagGroup], shown: int = 4) -> list[str]:
    """Each kind of flag once with its count and explanation, then its cases (the first `shown`)."""
    out = []
    for g in groups:
        unit = g.unit if g.count != 1 else g.unit[:-1]
        out.append(f"{g.title} ({g.count} {unit}): {g.explain}")
        out += [f"  {i.where}" + (f": {i.detail}" if i.detail else "") for i in g.items[:shown]]
        if g.count > shown:
            out.append(f"  … and {g.count - shown} more (moelab report lists them all)")
    return [safe_text(line) for line in out]


def nothing_measured_reason(db_path: Path, run_id: str) -> str | None:
    """`nothing_measured` over the stored run's case statuses: the reason line, or None."""
    from moelab.core.validate import nothing_measured

    with open_db(db_path, read_only=True) as con:
        statuses = [
            r[0] for r in con.execute("SELECT status FROM cases WHERE run_id = ?", [run_id]).fetchall()
        ]
    return nothing_measured(statuses)


def print_failures(db_path: Path, run_id: str, groups: Sequence[FlagGroup] = ()) -> int:
    """Print why jobs failed, then the flags of the measured cases grouped by kind (suspect, unstable,
    above the link peak: moelab.reports.flags), for a stored run; returns the lines printed."""
    with open_db(db_path, read_only=True) as con:
        lines = failure_lines(con, run_id)
    flagged = flag_lines(groups)
    if lines:
        console.print("why jobs failed:")
        for line in lines:
            console.print(line)
    if flagged:
        console.print("flags (the marks in the table above):")
        for line in flagged:
            console.print(f"  {line}")
    return len(lines) + len(flagged)
