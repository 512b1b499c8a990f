"""Names for runs. A label names one run at a time (`moelab label RUN NAME` moves it); the run's own
`runs.label` (from `moelab run --label`) is what it was called when it ran. A name resolves through the
run ids first, then the labels table, then runs.label (the newest run so called); a label may not be
another run's id, so a name set with `moelab label` is never hidden by one."""

from __future__ import annotations

import duckdb

from moelab.core.errors import MoelabError
from moelab.core.validate import normalized_name, require_text, validate_label


def _check_name(label: str) -> str:
    return validate_label(label)


def label_conflict(con: duckdb.DuckDBPyConnection, run_id: str, label: str) -> str | None:
    """Why `label` cannot name `run_id`: it is another run's id (a run id names one run for good; the
    label would hide it, or be hidden by it)."""
    name = normalized_name(label)
    if name != run_id and con.execute("SELECT 1 FROM runs WHERE run_id = ?", [name]).fetchone():
        return f"label {name!r} is the id of another run: a label may not hide a run id (choose another name)"
    return None


def set_label(con: duckdb.DuckDBPyConnection, run_id: str, label: str) -> str | None:
    """Point `label` at `run_id`; returns the run it named before (None if it is new)."""
    name = _check_name(label)
    if not con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone():
        raise MoelabError(f"no such run: {run_id}")
    conflict = label_conflict(con, run_id, name)
    if conflict:
        raise MoelabError(conflict)
    row = con.execute("SELECT run_id FROM labels WHERE label = ?", [name]).fetchone()
    con.execute(
        "INSERT OR REPLACE INTO labels (label, run_id, created_at) VALUES (?, ?, now())", [name, run_id]
    )
    return str(row[0]) if row else None


def remove_label(con: duckdb.DuckDBPyConnection, label: str) -> str:
    label = normalized_name(require_text(label, "label"))
    row = con.execute("SELECT run_id FROM labels WHERE label = ?", [label]).fetchone()
    if not row:
        raise MoelabError(f"no such label: {label}")
    con.execute("DELETE FROM labels WHERE label = ?", [label])
    return str(row[0])


def list_labels(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, object]]:
    return [
        tuple(r)
        for r in con.execute("SELECT label, run_id, created_at FROM labels ORDER BY label").fetchall()
    ]  # type: ignore[misc]


def names_by_run(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """The names each run answers to now: its labels, and its own `--label` unless `moelab label` has
    moved that name to another run (a moved label shows on its new run only)."""
    out: dict[str, list[str]] = {}
    for run_id, name in con.execute("SELECT run_id, label FROM labels ORDER BY label").fetchall():
        out.setdefault(str(run_id), []).append(str(name))
    claimed = {n: r for r, names in out.items() for n in names}
    for run_id, own in con.execute("SELECT run_id, label FROM runs WHERE label IS NOT NULL").fetchall():
        names = out.setdefault(str(run_id), [])
        if claimed.get(own, run_id) == run_id and own not in names:
            names.insert(0, str(own))
    return out


def resolve_run(con: duckdb.DuckDBPyConnection, ref: str) -> str:
    """A run id, else a label (labels table), else a run's own label (newest such run); in NFC, as labels
    are stored. A run id names one run for good, so it goes first: `check --run acc-a2a` checked the newest
    run labelled acc-a2a (run acc-a2a-lib), not run acc-a2a. A label that is another run's id is refused
    when it is set (`label_conflict`); one stored before that rule loses to the run id."""
    ref = normalized_name(require_text(ref, "run or label"))
    for sql in (
        "SELECT run_id FROM runs WHERE run_id = ?",
        "SELECT run_id FROM labels WHERE label = ?",
        "SELECT run_id FROM runs WHERE label = ? ORDER BY created_at DESC, run_id DESC LIMIT 1",
    ):
        row = con.execute(sql, [ref]).fetchone()
        if row:
            return str(row[0])
    names = [r[0] for r in con.execute("SELECT label FROM labels ORDER BY label LIMIT 20").fetchall()]
    known = f" (labels: {', '.join(names)})" if names else ""
    raise MoelabError(f"no such run: {ref!r} is neither a label nor a run id{known}")
