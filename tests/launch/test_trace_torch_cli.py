"""`moelab run --trace torch` through the command: every measured case, dispatch/combine and e2e layer
alike, leaves its ranks' Chrome traces on disk and their paths in the store's `traces` table."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.argv import with_flags
from tests.launch.test_crash_isolation import SMALL

pytestmark = pytest.mark.slow  # real gloo ranks under torch.profiler


@pytest.mark.parametrize("suite", ["dispatch-combine", "e2e"])
def test_every_traced_case_stores_each_ranks_trace(tmp_path: Path, db_path: Path, suite: str) -> None:
    out = tmp_path / "runs"
    timing = ["--sms", "default", "--iters", "2", "--warmup", "1", "--no-health", "--quiet"]
    traced = ["--trace", "torch", "--trace-iters", "1", "--run-id", "traced", "--out", str(out)]
    args = ["run", "--cpu", "--suite", suite, *with_flags([*timing, *traced], *SMALL)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db_path), read_only=True) as con:
        measured = {r[0] for r in con.execute("SELECT case_id FROM cases WHERE status = 'ok'").fetchall()}
        traces = con.execute(
            "SELECT case_id, rank, kind, path FROM traces WHERE run_id = 'traced'"
        ).fetchall()
    assert measured, result.output
    assert {(case_id, rank) for case_id, rank, _, _ in traces} == {(c, r) for c in measured for r in (0, 1)}
    for _, _, kind, path in traces:
        assert kind == "torch" and (out / "traced" / path).is_file()
    if suite == "e2e":
        assert all("bench=e2e" in c for c in measured)
