"""`moelab ingest RUN_DIR`: store a run directory that was never stored (its launcher was killed, it ran on
another node, or storing failed), once: a run already in the database is left as it is."""

from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.common import DB_OPTION_HELP, console, user_errors
from moelab.core.errors import MoelabError
from moelab.job.rundir import RunDir
from moelab.launch.recover import launcher_state, mark_abandoned
from moelab.store.db import check_writable, open_db, resolve_db_path
from moelab.store.ingest import ingest as ingest_run_dir
from moelab.store.judgments import judge


def _read_run_dir(path: Path) -> tuple[RunDir, str, dict[str, object]]:
    if not RunDir(path).spec_file.is_file():
        raise MoelabError(f"{path} is not a run directory (no spec.json)")
    rd = RunDir(path)
    try:
        run_id = rd.spec.run_id
        info = rd.info()
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise MoelabError(f"{path}: unreadable spec.json or run.json ({exc})") from None
    return rd, run_id, info


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
        with open_db(db_path, read_only=True) as con:
            stored = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if stored is not None and not replace:
            console.print(
                f"run {run_id} is already stored in {db_path} (status {stored[0]}); nothing to do "
                "(--replace reads the directory again)"
            )
            return
    if info.get("status") == "running":
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
    check_writable(db_path)
    with open_db(db_path) as con:
        ingest_run_dir(con, rd.path)
        judge(con, run_id)
        counts = con.execute(
            "SELECT status, count(*) FROM cases WHERE run_id = ? GROUP BY status ORDER BY status", [run_id]
        ).fetchall()
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    summary = ", ".join(f"{n} {s}" for s, n in counts) or "no cases"
    console.print(f"stored run {run_id} ({status[0] if status else '?'}; cases: {summary}) in {db_path}")
