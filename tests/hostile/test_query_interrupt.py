"""Ctrl-C on a `moelab db query` that never ends (issue 41): DuckDB's call used to hold the signal until the
query finished; now the query is interrupted and moelab exits 130 with one line, at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hostile.world import REPO, World, store_state


@pytest.mark.slow
def test_ctrl_c_stops_a_query_that_never_ends(tmp_path: Path) -> None:
    w = World.build(tmp_path)
    before = store_state(w.db)
    endless = "SELECT count(*) FROM range(1000000000000) a, range(1000000000000) b"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moelab.cli.main", "db", "query", endless, "--db", str(w.db)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(6)  # started, and inside DuckDB's call
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == 130, text
    assert took < 10, took
    assert "Traceback" not in text and [ln for ln in text.splitlines() if ln.startswith("error:")], text
    assert store_state(w.db) == before
