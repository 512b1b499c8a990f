"""`moelab run --cpu` of a small e2e suite on gloo ranks, for the tests that check what the command stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
from typer.testing import CliRunner

from moelab.cli.main import app


def run_nccl_a2a_e2e(
    tmp_path: Path,
    db_path: Path,
    run_id: str,
    workload: dict[str, Any],
    axes: dict[str, list[Any]],
    *columns: str,
) -> list[tuple[Any, ...]]:
    """Run nccl-a2a's e2e cases of `workload` crossed with `axes` (values as TOML writes them), which must
    exit 0, and return each stored case's `columns` (SQL over the cases table)."""

    def toml(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, str):
            return f'"{value}"'
        if isinstance(value, list):
            return "[" + ", ".join(toml(v) for v in value) + "]"
        return str(value)

    lines = [f'name = "{run_id}"', "[workload]"]
    lines += [f"{k} = {toml(v)}" for k, v in workload.items()]
    lines += ["[backend.nccl-a2a.axes]", 'bench = ["e2e"]']
    lines += [f"{k} = {toml(v)}" for k, v in axes.items()]
    suite = tmp_path / f"{run_id}.toml"
    suite.write_text("\n".join(lines) + "\n")
    args = ["run", "--cpu", "--suite", str(suite), "--iters", "2", "--warmup", "0", "--no-health", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--run-id", run_id, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db_path), read_only=True) as con:
        return con.execute(f"SELECT {', '.join(columns)} FROM cases WHERE run_id = ?", [run_id]).fetchall()
