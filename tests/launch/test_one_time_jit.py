"""A backend that compiles on the first call of each case (Hybrid-EP's JIT) has that first call timed as
the one-time cost "jit": shown in the console and stored per job, apart from every measurement."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.launch.test_crash_isolation import SMALL


@pytest.mark.slow
def test_first_call_compilation_is_a_one_time_cost(plugin_path: Path, db_path: Path, tmp_path: Path) -> None:
    args = ["run", "--backend", "test-jit,nccl-a2a", "--cpu", "--out", str(tmp_path / "runs"), "--no-health",
            "--seed", "0,1", *SMALL]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "one-time jit" in result.output
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        rows = dict(con.execute("SELECT backend, one_time_s FROM jobs").fetchall())
    finally:
        con.close()
    jit = json.loads(rows["test-jit"]).get("jit", 0.0)
    assert jit >= 2 * 0.4  # two cases, each compiled on its first call
    assert "jit" not in json.loads(rows["nccl-a2a"])  # nccl-a2a compiles nothing
