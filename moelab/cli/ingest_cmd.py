"""`moelab ingest RUN_DIR`: store a run directory that was never stored (its launcher was killed, it ran on
another node, or storing failed), once: a run already in the database is left as it is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from moelab.cli.common import DB_OPTION_HELP, console, user_errors
from moelab.core.display import safe_text
from moelab.core.errors import MoelabError
from moelab.job.rundir import RunDir
from moelab.launch.recover import launcher_state, mark_abandoned
from moelab.store.db import check_writable, open_db, resolve_db_path
from moelab.store.ingest import ingest_run
from moelab.store.judgments import judge


def _read_run_dir(path: Path) -> tuple[RunDir, str, dict[str, object]]:
    """The run directory, its run id and run.json; a file that is not as moelab wrote it is one error line
    naming it (moelab.job.safe_read)."""
    if not path.is_dir():
        raise MoelabError(f"{path} is not a run directory (not a folder)")
    rd = RunDir(path)
    return rd, rd.spec.run_id, rd.info()


@user_errors
def ingest(
    run_dir: Path = typer.Argument(..., help="A run directory (RUNS/<run id>, with spec.json)"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    replace: bool = typer.Option(
        False, "--replace", help="Read the directory again even if the run is already stored"
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Store a run marked running by a process on another host (which this host cannot check)",
    ),
) -> None:
    """Store a run directory in the database; a run already stored is left as it is (exit 0).

    A run whose launching process is gone (kill -9, a lost node) is marked interrupted, and every case
    its jobs finished is stored.

    Example: moelab ingest ~/.local/share/moelab/runs/20261122T101500Z-1a2b3c
    """
    rd, run_id, info = _read_run_dir(run_dir)
    db_path = resolve_db_path(db)
    if db_path.exists():
        check_writable(db_path)  # ingest writes: an older schema is migrated here, a foreign file refused
        with open_db(db_path, read_only=True) as con:
            if _already_stored(con, run_id, db_path, replace):
                return
    if info.get("status") == "running":
        _recover(rd, run_id, info, force)
    check_writable(db_path)
    with open_db(db_path) as con:
        # asked again under the write lock: an ingest of the same directory started at the same time may
        # have stored it since (it then replaced what the first stored, or both said nothing of the other)
        if _already_stored(con, run_id, db_path, replace):
            return
        done = ingest_run(con, rd.path)
        judge(con, run_id)
        counts = con.execute(
            "SELECT status, count(*) FROM cases WHERE run_id = ? GROUP BY status ORDER BY status", [run_id]
        ).fetchall()
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    for problem in done.problems:  # stored as its case's failure; said here too
        print(f"warning: {safe_text(problem)}", file=sys.stderr)
    summary = ", ".join(f"{n} {s}" for s, n in counts) or "no cases"
    console.print(f"stored run {run_id} ({status[0] if status else '?'}; cases: {summary}) in {db_path}")


def _already_stored(con: Any, run_id: str, db_path: Path, replace: bool) -> bool:
    """True, having said so, when the run is stored and --replace does not ask to read it again."""
    stored = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if stored is None or replace:
        return False
    console.print(
        f"run {run_id} is already stored in {db_path} (status {stored[0]}); nothing to do "
        "(--replace reads the directory again)"
    )
    return True


def _recover(rd: RunDir, run_id: str, info: dict[str, object], force: bool) -> None:
    """A run marked running: refused while its launcher lives (or, on another host, without --force);
    else marked interrupted, with a job.json for each job its dead launcher never finished."""
    state = launcher_state(info)
    pid, host = info.get("pid"), info.get("host")
    if state == "alive":
        raise MoelabError(
            f"run {run_id} is still running (pid {pid} on this host); it stores itself when done"
        )
    if state == "unknown" and not force:
        raise MoelabError(
            f"run {run_id} is marked running by pid {pid} on host {host}, which this host cannot check; "
            "if that process is gone, ingest with --force"
        )
    reason = (
        f"launcher pid {pid} on {host} is gone" if state == "gone" else "launcher presumed gone (--force)"
    )
    recovered = mark_abandoned(rd, reason)
    console.print(
        f"run {run_id}: {reason}; marked interrupted"
        + (f" (unfinished jobs: {', '.join(recovered)})" if recovered else "")
    )
