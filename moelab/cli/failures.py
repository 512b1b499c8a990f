"""The console's account of why jobs failed: the cause, and each rank's stack and last log lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moelab.cli.common import console
from moelab.core.display import safe_text
from moelab.store.db import open_db

TAIL_SHOWN = 6
SHOWN_MAX = 500  # characters of a stored description on the console; the rest is in the store and on disk


def _capped(text: object) -> str:
    s = str(text or "")
    return s if len(s) <= SHOWN_MAX else f"{s[:SHOWN_MAX]}… ({len(s) - SHOWN_MAX} more characters)"


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
            out += [f"    | {safe_text(line)}" for line in lines]
    return out


def suspect_lines(con: Any, run_id: str, shown: int = 10) -> list[str]:
    """Measured cases marked suspect (health worsened, the machine was shared, spread too wide), grouped
    by reason so that one reason shared by every case is said once."""
    rows = con.execute(
        "SELECT backend, suspect_reason, list(case_id ORDER BY case_id) FROM cases_judged "
        "WHERE run_id = ? AND suspect GROUP BY ALL ORDER BY backend, suspect_reason",
        [run_id],
    ).fetchall()
    out = []
    for backend, reason, cases in rows:
        names = ", ".join(cases[:3]) + (f" and {len(cases) - 3} more" if len(cases) > 3 else "")
        out.append(f"[{safe_text(backend)}] {len(cases)} case(s) ({safe_text(names)}): {safe_text(reason)}")
    return out[:shown]


def nothing_measured_reason(db_path: Path, run_id: str) -> str | None:
    """`nothing_measured` over the stored run's case statuses: the reason line, or None."""
    from moelab.core.validate import nothing_measured

    with open_db(db_path, read_only=True) as con:
        statuses = [
            r[0] for r in con.execute("SELECT status FROM cases WHERE run_id = ?", [run_id]).fetchall()
        ]
    return nothing_measured(statuses)


def print_failures(db_path: Path, run_id: str) -> int:
    """Print why jobs failed and which measured cases are suspect, for a stored run; returns the lines."""
    with open_db(db_path, read_only=True) as con:
        lines = failure_lines(con, run_id)
        suspects = suspect_lines(con, run_id)
    if lines:
        console.print("why jobs failed:")
        for line in lines:
            console.print(line)
    if suspects:
        console.print("suspect (measured while something else shared the machine, or too noisy):")
        for line in suspects:
            console.print(f"  {line}")
    return len(lines) + len(suspects)
