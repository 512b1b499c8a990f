"""A user's SQL (`moelab db query`): at most a stated number of rows fetched, and Ctrl-C heard while DuckDB
works. DuckDB streams a result, so a query over millions of rows costs only the rows taken; the query runs
in a worker thread (on a cursor of its own: DuckDB refuses a second call on a busy connection) because
Python's signal handler cannot run inside DuckDB's call; Ctrl-C there calls the cursor's `interrupt()`
instead of waiting for a query that may never end."""

from __future__ import annotations

import contextlib
import threading
import time
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
    worker.start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        # again and again until the worker is out: a Ctrl-C that lands before DuckDB has begun the query
        # (the thread not yet inside execute) finds nothing to interrupt, and the query then ran for ever
        # (seen once in CI on a loaded two-core machine; the connection's close then waited on it)
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while time.monotonic() < deadline:
            cur.interrupt()
            if done.wait(0.05):
                break
        raise
    finally:
        if done.is_set():
            with contextlib.suppress(duckdb.Error):  # an interrupted cursor may still call itself busy
                cur.close()
    error = box.get("error")
    if isinstance(error, duckdb.Error):
        raise MoelabError(f"query failed: {str(error).strip().splitlines()[0][:500]}") from error
    if error is not None:
        raise error
    result: QueryResult = box["result"]
    return result
