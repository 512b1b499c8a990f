"""What a hostile-input case runs in: a store with two runs, a run directory never stored, helpers that
break them the ways the issue found, and the checks every case makes (exit code, one `error:` line or a
stored failure, the store unchanged or the run stored exactly once, no process left behind)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.store.export import export_runs
from moelab.store.schema import MIGRATIONS, VIEWS
from tests.synthetic_runs import RunModel, build_db, write_run

REPO = Path(__file__).resolve().parent.parent.parent
NEW_RUN = "r-new"  # the run directory each case may ingest: two cases, never stored before the case
SAFE = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None
    wall_s: float = 0.0  # from the command's start to its end
    after_act_s: float | None = None  # for a case that acts while it runs: from the act to the end

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


@dataclass
class World:
    root: Path
    db: Path = field(init=False)
    runs: Path = field(init=False)
    new_run: Path = field(init=False)
    store: Path = field(init=False)  # the database file a case must leave unchanged (or store once into)
    keep: list[Path] = field(default_factory=list)  # other files a case must leave byte-identical
    absent: list[Path] = field(default_factory=list)  # files a case must not create
    env: dict[str, str] = field(default_factory=dict)  # for a subprocess case: its environment's changes
    preexec: Callable[[], None] | None = None  # for a subprocess case: run in the child before moelab
    signal: signal.Signals | None = None  # for a signal case: what to send, once `ready` holds a line
    ready: Path | float | Callable[[], bool] | None = None  # a file holding a line, seconds, or a test
    act: Callable[[subprocess.Popen[bytes]], None] | None = None  # what to do then (else: send `signal`)
    others: list[Outcome] = field(default_factory=list)  # commands an act ran beside the case's own
    patches: dict[str, object] = field(default_factory=dict)  # for an in-process case: attributes replaced
    outputs: list[Path] = field(default_factory=list)  # where a case may write, besides runs/ and the store

    def __post_init__(self) -> None:
        self.runs = self.root / "runs"
        self.db = self.root / "store" / "moelab.duckdb"
        self.new_run = self.runs / NEW_RUN
        self.store = self.db

    @classmethod
    def build(cls, root: Path) -> World:
        """The inputs every case starts from (built once per session, then copied: see `copy_to`)."""
        w = cls(root)
        build_db(
            w.db,
            w.runs,
            [
                RunModel(run_id="r1", created_at="2026-11-20T07:00:00+00:00", label="nightly", iters=8),
                RunModel(run_id="r2", created_at="2026-11-21T07:00:00+00:00", iters=8),
            ],
        )
        write_run(w.runs, RunModel(run_id=NEW_RUN, tokens=(256, 512), iters=8))
        return w

    def copy_to(self, root: Path) -> World:
        for name in ("runs", "store"):
            shutil.copytree(self.root / name, root / name)
        return World(root)

    # --- paths and files --------------------------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def job(self, name: str) -> Path:
        return self.new_run / "nccl-a2a" / name

    def results_lines(self) -> list[bytes]:
        return self.job("results.jsonl").read_bytes().splitlines()

    def write_results(self, data: bytes) -> None:
        self.job("results.jsonl").write_bytes(data)

    def edit_json(self, path: Path, change: Callable[[Any], object]) -> None:
        """Change a JSON file in place (`change` mutates the parsed document)."""
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    def link(self, path: Path, target: str | Path) -> Path:
        path.unlink(missing_ok=True)
        path.symlink_to(target)
        return path

    def truncated_db(self, keep: float) -> Path:
        """The store cut after `keep` bytes (a fraction: of its size). Cut inside its header it does not
        open; cut after half it opens, and a query fails when it reaches a missing block."""
        data = self.db.read_bytes()
        path = self.path("truncated.duckdb")
        path.write_bytes(data[: int(keep * len(data)) if keep < 1 else int(keep)])
        return path

    def sqlite_db(self) -> Path:
        import sqlite3

        path = self.path("other.sqlite")
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE runs (run_id TEXT)")
        return path

    def foreign_db(self) -> Path:
        path = self.path("foreign.duckdb")
        con = duckdb.connect(str(path), config=SAFE)
        con.execute("CREATE TABLE orders AS SELECT range AS id FROM range(10)")
        con.close()
        return path

    def db_at_version(self, version: int) -> Path:
        """A store written by an older (or newer) moelab: migrations up to `version`, one run's row."""
        path = self.path(f"v{version}.duckdb")
        con = duckdb.connect(str(path), config=SAFE)
        con.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description VARCHAR, applied_at TIMESTAMP DEFAULT now())"
        )
        for m in MIGRATIONS:
            if m.version > version:
                break
            for stmt in m.statements:
                con.execute(stmt)
            for view in VIEWS:  # as moelab before schema 11 made them: once, in the migration that added them
                if view.since == m.version:
                    con.execute(view.create())
        con.execute("INSERT INTO schema_version (version, description) VALUES (?, 'test')", [version])
        if version >= 1:
            con.execute("INSERT INTO runs (run_id, status, created_at) VALUES ('old-1', 'complete', now())")
        con.close()
        return path

    def export(self, folder: str = "export") -> Path:
        out = self.path(folder)
        con = duckdb.connect(str(self.db), read_only=True, config=SAFE)
        try:
            export_runs(con, out, "parquet", None)
        finally:
            con.close()
        return out

    def fifo(self, path: Path) -> Path:
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        return path

    # --- running ---------------------------------------------------------------------------------------
    def cli(self, argv: list[str]) -> Outcome:
        t0 = time.monotonic()
        result = CliRunner().invoke(app, argv)
        exc = result.exception if not isinstance(result.exception, SystemExit) else None
        return Outcome(result.exit_code, result.stdout, result.stderr, exc, time.monotonic() - t0)

    def proc(
        self,
        argv: list[str | bytes],
        env: dict[str, str] | None = None,
        preexec: Any = None,
        timeout: float = 180,
    ) -> Outcome:
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "moelab.cli.main", *argv],
            env=full_env,
            cwd=self.root,
            capture_output=True,
            timeout=timeout,
            preexec_fn=preexec,
        )
        return Outcome(
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
            wall_s=time.monotonic() - t0,
        )

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """A `moelab` command started in the background, as a user's second shell starts one."""
        return subprocess.Popen(
            [sys.executable, "-m", "moelab.cli.main", *argv],
            env={**os.environ, "PYTHONPATH": str(REPO), **self.env},
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = 240) -> Outcome:
        """Wait for a started command (killed past `timeout`) and read what it printed."""
        t0 = time.monotonic()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # killed, then drained: its pipes closed here, not by the garbage collector in a later test (an
            # unclosed pipe's ResourceWarning failed the next test too)
            proc.kill()
            out, err = proc.communicate()
        return Outcome(
            proc.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            wall_s=time.monotonic() - t0,
        )

    def is_ready(self, t0: float) -> bool:
        if isinstance(self.ready, float | int):
            return time.monotonic() - t0 >= self.ready
        if callable(self.ready):
            return self.ready()
        return self.ready is not None and self.ready.exists() and bool(self.ready.read_text().strip())

    def interfered(self, argv: list[str], timeout: float = 240) -> Outcome:
        """Start a command, act on it (send `signal`, move its folder, start a second command) once `ready`
        holds, and wait for it to end."""
        t0 = time.monotonic()
        proc = self.start(argv)
        try:
            deadline = t0 + timeout
            while time.monotonic() < deadline and proc.poll() is None and not self.is_ready(t0):
                time.sleep(0.2)
            acted = time.monotonic()
            if self.act is not None:
                self.act(proc)
            elif self.signal is not None:
                proc.send_signal(self.signal)
            done = self.finish(proc, timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()  # and its pipes closed
        end = time.monotonic()
        return Outcome(done.code, done.stdout, done.stderr, wall_s=end - t0, after_act_s=end - acted)


# --- what a case must leave behind -------------------------------------------------------------------------


def store_state(path: Path) -> Any:
    """Every table's rows of a database, sorted (a file DuckDB cannot read: its bytes' hash)."""
    if not path.exists():
        return "missing"
    if path.is_dir() or path.is_symlink():
        return ("not a file", path.is_dir())
    try:
        con = duckdb.connect(str(path), read_only=True, config=SAFE)
    except duckdb.Error:
        return ("bytes", hashlib.sha256(path.read_bytes()).hexdigest())
    try:
        tables = [
            r[0]
            for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()
        ]
        return {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"').fetchall())) for t in tables}
    except duckdb.Error:
        return ("bytes", hashlib.sha256(path.read_bytes()).hexdigest())
    finally:
        con.close()


def without_run(state: Any, *run_ids: str) -> Any:
    """`state` less the rows of the runs a case stores, to compare the rest."""
    if not isinstance(state, dict):
        return state
    marks = [f"'{run_id}'" for run_id in run_ids]
    return {t: [r for r in rows if not any(m in r for m in marks)] for t, rows in state.items()}


def rows_of(path: Path, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(path), read_only=True, config=SAFE)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def file_hashes(paths: list[Path]) -> dict[str, str]:
    out = {}
    for p in paths:
        for f in sorted([p] if p.is_file() else p.rglob("*")):
            if f.is_file():
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def processes_naming(needle: Path) -> list[str]:
    """Live processes (not this one) whose command line names `needle`: what a case left running."""
    text = str(needle).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state not in ("Z", "X"):
            words = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {words[:200]}")
    return found


def files_under(root: Path) -> set[Path]:
    """Every file and link under `root` (Python's bytecode caches left out: an imported plugin writes one)."""
    return {p for p in root.rglob("*") if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts}


def written_outside(w: World, before: set[Path]) -> list[str]:
    """Files a case's command created anywhere but in the run directories, beside its store, or in the
    outputs the case names (an export folder, a report): what escaped."""
    allowed = [w.runs, w.db.parent, *w.outputs]
    return sorted(
        str(p.relative_to(w.root))
        for p in files_under(w.root) - before
        if not any(p == a or a in p.parents for a in allowed) and not p.name.startswith(w.store.name)
    )
