"""`moelab db query`'s Ctrl-C always reaches the query (moelab.store.user_query.run_query): when it lands
before DuckDB has begun the query, inside the worker thread's start, or in a command started with SIGINT
ignored (a background command of a non-interactive shell: how two CI runs of the hostile case
`query-never-ends-stopped-by-ctrl-c` were started, which then ran on for ever)."""

from __future__ import annotations

import _thread
import threading
import time
from pathlib import Path
from typing import Any, cast

import duckdb
import pytest

from moelab.store.user_query import run_query

ROOT = Path(__file__).resolve().parents[2]
ENDLESS = "SELECT count(*) FROM range(1000000000000) a, range(1000000000000) b"


class _LateCursor:
    """A DuckDB cursor whose execute begins `delay` seconds late: the worker thread has started but is not
    yet inside DuckDB when Ctrl-C comes."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, delay: float) -> None:
        self._cur, self._delay = cur, delay
        self.ended = threading.Event()

    def execute(self, sql: str) -> Any:
        time.sleep(self._delay)
        try:
            return self._cur.execute(sql)
        finally:
            self.ended.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


class _Connection:
    def __init__(self, delay: float) -> None:
        self._con = duckdb.connect()
        self.cursor_made: _LateCursor | None = None
        self._delay = delay

    def cursor(self) -> _LateCursor:
        self.cursor_made = _LateCursor(self._con.cursor(), self._delay)
        return self.cursor_made


def test_ctrl_c_before_duckdb_begins_the_query_still_stops_it() -> None:
    con = _Connection(delay=0.5)
    threading.Timer(0.1, _thread.interrupt_main).start()  # Ctrl-C while the worker sleeps before execute
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_query(cast(duckdb.DuckDBPyConnection, con), ENDLESS)
    assert con.cursor_made is not None
    stopped = con.cursor_made.ended.wait(5)
    if not stopped:  # the bug: free the thread before failing (interrupt it now that the query runs)
        con.cursor_made.interrupt()
        con.cursor_made.ended.wait(10)
    assert stopped, "the query outlived Ctrl-C"
    assert time.monotonic() - t0 < 5


def test_ctrl_c_inside_the_query_stops_it_at_once() -> None:
    con = _Connection(delay=0.0)
    threading.Timer(0.5, _thread.interrupt_main).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_query(cast(duckdb.DuckDBPyConnection, con), ENDLESS)
    assert con.cursor_made is not None and con.cursor_made.ended.wait(5)
    assert time.monotonic() - t0 < 5


def test_ctrl_c_while_the_worker_starts_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGINT to this process inside Thread.start (after the thread began, while start waits for
    it): before, the KeyboardInterrupt left run_query before its handler and the query ran for ever."""
    import os
    import signal

    import moelab.store.user_query as uq

    class _SignalledThread(threading.Thread):
        def start(self) -> None:
            super().start()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)  # where Python would raise it: still inside start

    monkeypatch.setattr(uq.threading, "Thread", _SignalledThread)
    con = _Connection(delay=0.2)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_query(cast(duckdb.DuckDBPyConnection, con), ENDLESS)
    assert con.cursor_made is not None
    stopped = con.cursor_made.ended.wait(5)
    if not stopped:  # the bug: free the thread before failing
        con.cursor_made.interrupt()
        con.cursor_made.ended.wait(10)
    assert stopped, "the query outlived Ctrl-C"
    assert time.monotonic() - t0 < 5


def test_db_query_stops_on_sigint_even_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    """A command started in the background by a non-interactive shell inherits SIGINT ignored (POSIX), and
    Python then installs no KeyboardInterrupt for it: `moelab db query` ran on for ever after its SIGINT
    (the hostile case query-never-ends-stopped-by-ctrl-c, with CI started that way). While a query runs
    the command now takes SIGINT itself, as `moelab run` does for its run."""
    import os
    import signal
    import subprocess
    import sys

    from moelab.store.db import open_db

    db = tmp_path / "moelab.duckdb"
    with open_db(db):  # an empty store, its schema made
        pass
    proc = subprocess.Popen(
        [sys.executable, "-m", "moelab.cli.main", "db", "query", ENDLESS, "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    time.sleep(4.0)  # inside the query by then (imports take about 1.5 s here)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("moelab db query ran on after SIGINT")
    assert proc.returncode == 130, err
    assert b"query interrupted (Ctrl-C)" in err
