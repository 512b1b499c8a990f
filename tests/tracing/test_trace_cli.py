"""`trace summarize` through CliRunner, on a tiny app that mounts the sub-app as the lead's CLI does."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from moelab.cli import trace
from tests.tracing.test_nsys_sqlite import build_db
from tests.tracing.test_torch_trace import _gpu_trace

root = typer.Typer()
root.add_typer(trace.app, name="trace")


@root.callback()
def _main() -> None:
    """Test root."""


runner = CliRunner()


def test_summarize_chrome_trace_table(tmp_path: Path) -> None:
    path = tmp_path / "rank1.json"
    path.write_text(json.dumps(_gpu_trace()))
    res = runner.invoke(root, ["trace", "summarize", str(path)])
    assert res.exit_code == 0, res.output
    assert "moelab/b/dispatch/c" in res.output
    assert "ncclDevKernel_AllToAll" in res.output and "index_kernel" in res.output
    assert "69.2%" in res.output  # 45 / 65 of the range's kernel time
    assert "attribution=correlation" in res.output


def test_summarize_json_and_prefix(tmp_path: Path) -> None:
    path = tmp_path / "rank1.json"
    path.write_text(json.dumps(_gpu_trace()))
    res = runner.invoke(root, ["trace", "summarize", str(path), "--json", "--prefix", ""])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["rank"] == 1 and data["format"] == "chrome"
    assert {r["name"] for r in data["ranges"]} == {"moelab/b/dispatch/c", "other"}
    dispatch = next(r for r in data["ranges"] if r["name"] == "moelab/b/dispatch/c")
    assert dispatch["kernel_us_total"] == 55.0


def test_summarize_nsys_sqlite(tmp_path: Path) -> None:
    db = build_db(tmp_path / "deepep_rank0.sqlite")
    res = runner.invoke(root, ["trace", "summarize", str(db)])
    assert res.exit_code == 0, res.output
    assert "moelab/deepep/combine/c" in res.output and "combine_kernel" in res.output
    assert "rank=0" in res.output


def test_summarize_no_matching_ranges(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": []}))
    res = runner.invoke(root, ["trace", "summarize", str(path)])
    assert res.exit_code == 0 and "no ranges" in res.output


def test_user_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    res = runner.invoke(root, ["trace", "summarize", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "error: no trace at" in res.output
    odd = tmp_path / "trace.txt"
    odd.write_text("x")
    res = runner.invoke(root, ["trace", "summarize", str(odd)])
    assert res.exit_code == 2 and "unknown trace type" in res.output
    rep = tmp_path / "a_rank0.nsys-rep"
    rep.write_bytes(b"x")
    res = runner.invoke(root, ["trace", "summarize", str(rep), "--nsys", str(tmp_path / "no-nsys")])
    assert res.exit_code == 2 and "not found" in res.output


def test_every_command_has_help() -> None:
    res = runner.invoke(root, ["trace", "--help"])
    assert res.exit_code == 0 and "summarize" in res.output
    res = runner.invoke(root, ["trace", "summarize", "--help"])
    assert res.exit_code == 0 and "--json" in res.output and "Example:" in res.output
