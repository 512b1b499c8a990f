"""`moelab db query`'s Ctrl-C reaches the query even when it lands before DuckDB has begun it
(moelab.store.user_query.run_query). In CI on a loaded two-core machine the SIGINT of the hostile case
`query-never-ends-stopped-by-ctrl-c` arrived while the worker thread had not yet entered DuckDB: the one
interrupt() found nothing running, the query then ran for ever and the command never ended."""

from __future__ import annotations

import _thread
import threading
import time
from typing import Any, cast

import duckdb
import pytest

from moelab.store.user_query import run_query

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
