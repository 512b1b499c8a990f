"""Issue 41's cases whose check is more than an exit code and a line: `moelab model --json` output that a
strict JSON parser reads whole, and `--check-published` over no tables failing instead of passing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.hostile.world import World


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_model_from_run_json_is_json_alone(tmp_path: Path) -> None:
    w = World.build(tmp_path)
    out = CliRunner().invoke(
        app, ["model", "--from-run", "r1", "--experts-per-rank", "4", "--json", "--db", str(w.db)]
    )
    assert out.exit_code == 0, out.stderr
    doc = _strict(out.stdout)  # the note about missing peaks went to stderr, not before the JSON
    assert isinstance(doc, dict) and doc["bounds"]
    assert "stored no measured peaks" in out.stderr


def test_model_json_is_strict_where_a_link_has_no_bound() -> None:
    out = CliRunner().invoke(app, ["model", "--json"])
    assert out.exit_code == 0, out.stderr
    _strict(out.stdout)


def test_check_published_over_no_tables_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("moelab.model.published.dataset_paths", lambda: {})
    out = CliRunner().invoke(app, ["model", "--check-published", "--json"])
    assert out.exit_code == 1
    assert _strict(out.stdout) == {"ok": False, "tables": [], "rows": []}
    assert [ln for ln in out.stderr.splitlines() if ln.startswith("error:")] == [
        "error: no published rows to check: the published tables are missing from this install"
    ]


def test_a_rank_log_line_is_cut_at_1000_characters(tmp_path: Path) -> None:
    """A rank whose traceback holds one 80,005-character line: the console's excerpt cuts each line at
    1,000 characters, as it cuts error lines."""
    import duckdb

    from moelab.cli.failures import failure_lines

    w = World.build(tmp_path)
    con = duckdb.connect(str(w.db))
    try:
        con.execute("UPDATE jobs SET status = 'failed', description = 'rank 0 failed' WHERE run_id = 'r1'")
        tail = "Traceback (most recent call last):\nRuntimeError: " + "x" * 80_005 + "\n"
        con.execute(
            "INSERT INTO failure_diagnosis (run_id, backend, rank, exc_type, exc_message, log_tail, root_cause, "
            "headline) VALUES ('r1', 'nccl-a2a', 0, 'RuntimeError', ?, ?, true, 'rank 0: RuntimeError')",
            ["x" * 80_005, tail],
        )
        lines = failure_lines(con, "r1")
    finally:
        con.close()
    assert any("RuntimeError: xxx" in line for line in lines)
    assert max(len(line) for line in lines) < 1_100, max(len(line) for line in lines)


def test_ragged_samples_are_flagged(tmp_path: Path) -> None:
    import duckdb

    from tests.hostile.second_pass import make_ragged

    w = World.build(tmp_path)
    make_ragged(w)
    out = CliRunner().invoke(app, ["ingest", str(w.new_run), "--db", str(w.db)])
    assert out.exit_code == 0, out.stderr
    assert "warning:" in out.stderr and "ragged samples" in out.stderr
    con = duckdb.connect(str(w.db), read_only=True)
    try:
        reasons = con.execute(
            "SELECT suspect_reason FROM cases WHERE run_id = 'r-new' AND suspect ORDER BY case_id"
        ).fetchall()
    finally:
        con.close()
    assert len(reasons) == 1 and "rank 1 holds 1" in reasons[0][0], reasons
