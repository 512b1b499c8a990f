"""A user's SQL (`moelab db query`): at most a stated number of rows fetched, and Ctrl-C heard while DuckDB
works. DuckDB streams a result, so a query over millions of rows costs only the rows taken; the query runs
in a worker thread (on a cursor of its own: DuckDB refuses a second call on a busy connection) because
Python's signal handler cannot run inside DuckDB's call; Ctrl-C there calls the cursor's `interrupt()`
instead of waiting for a query that may never end. While the query runs, Ctrl-C is noted by a handler of
its own (nothing is raised mid-way, so none is lost in the thread's start or before DuckDB has begun the
query: both were seen on a loaded machine) and the query is interrupted until the worker is out; then
KeyboardInterrupt is raised."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from moelab.core.errors import MoelabError

ROW_CAP = 10_000  # rows `moelab db query` prints; more are cut with a note (page with LIMIT ... OFFSET ...)
INTERRUPT_WAIT_S = 10.0  # how long Ctrl-C keeps interrupting the query before giving up on it


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str] | None  # None: a statement that returns no rows
    rows: list[tuple[Any, ...]]
    cut: bool  # more rows than `rows` were there


def _take_sigint(handler: Callable[[int, Any], None]) -> Any:
    """Install `handler` for SIGINT while a query runs; returns what to put back (None off the main thread,
    where no Ctrl-C arrives and no handler can be installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)


def _give_back_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def run_query(con: duckdb.DuckDBPyConnection, sql: str, cap: int = ROW_CAP) -> QueryResult:
    box: dict[str, Any] = {}
    cur = con.cursor()
    # an Event, not Thread.join: a join that Ctrl-C interrupts leaves is_alive() false on Python 3.11
    # (CPython gh-90882), and the process would then exit under a thread still inside DuckDB
    done = threading.Event()

    def work() -> None:
        try:
            cur.execute(sql)
            if cur.description is None:
                box["result"] = QueryResult(None, [], False)
                return
            rows = cur.fetchmany(cap + 1)
            box["result"] = QueryResult([d[0] for d in cur.description], rows[:cap], len(rows) > cap)
        except BaseException as exc:  # handed to the main thread, which reports it
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="moelab-query", daemon=True)
    asked = threading.Event()

    def on_ctrl_c(signum: int, frame: Any) -> None:  # runs in this thread, between its bytecodes
        asked.set()
        cur.interrupt()

    previous = _take_sigint(on_ctrl_c)
    try:
        worker.start()  # Ctrl-C is only noted here: a KeyboardInterrupt inside start() left the query running
        give_up = None
        while not done.wait(0.05):
            if asked.is_set():
                # again and again until the worker is out: a Ctrl-C before DuckDB has begun the query finds
                # nothing to interrupt (seen on a loaded two-core machine: the query then ran for ever)
                cur.interrupt()
                give_up = give_up or time.monotonic() + INTERRUPT_WAIT_S
                if time.monotonic() > give_up:
                    break
    finally:
        _give_back_sigint(previous)
        if done.is_set():
            with contextlib.suppress(duckdb.Error):  # an interrupted cursor may still call itself busy
                cur.close()
    if asked.is_set():
        raise KeyboardInterrupt
    error = box.get("error")
    if isinstance(error, duckdb.Error):
        raise MoelabError(f"query failed: {str(error).strip().splitlines()[0][:500]}") from error
    if error is not None:
        raise error
    result: QueryResult = box["result"]
    return result
