"""Stored strings reach terminals and reports escaped; a label that moves shows on its new run only.

The database is built by the real ingest from synthetic run directories, then a hostile label is written
into it as an old database (before labels were checked) could hold one."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.reports.html import write_report
from moelab.store import labels
from moelab.store.db import connect
from tests.synthetic_runs import RunModel, build_db

HOSTILE = "\x1b[31mRED\x1b]0;pwned-title\x07\x1b[2J"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    build_db(path, tmp_path / "runs", [
        RunModel(run_id="rA", created_at="2026-11-20T07:00:00+00:00", label="nightly", iters=5),
        RunModel(run_id="rB", created_at="2026-11-21T07:00:00+00:00", iters=5),
        RunModel(run_id="rC", created_at="2026-11-19T07:00:00+00:00", iters=5),
    ])  # fmt: skip
    return path


def _no_control(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text


def test_hostile_label_in_an_old_database_is_escaped_everywhere(db: Path, tmp_path: Path) -> None:
    con = connect(db)
    try:
        con.execute("UPDATE runs SET label = ? WHERE run_id = 'rB'", [HOSTILE])
        con.execute("INSERT INTO labels (label, run_id) VALUES (?, 'rC')", [HOSTILE + "2"])
        con.execute("UPDATE cases SET status = 'failed', reason = ? WHERE run_id = 'rB'", ["boom" + HOSTILE])
    finally:
        con.close()
    runner = CliRunner()
    for argv in (
        ["runs", "--db", str(db)],
        ["compare", "--by", "label", "--run", "rA", "--run", "rB", "--db", str(db)],
        ["label", "--list", "--db", str(db)],
    ):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0, r.output
        _no_control(r.output)
        assert "\\x1b[31mRED" in r.output, argv
    for fmt in ("html", "md"):
        text = write_report(db, ["rA", "rB"], tmp_path / f"r.{fmt}", fmt=fmt).read_text()
        _no_control(text)
        assert "\\x1b[31mRED" in text
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    r = runner.invoke(app, ["check", "--baseline", HOSTILE + "2", "--run", "rA", "--db", str(db),
                            "--junit", str(junit), "--summary", str(summary)])  # fmt: skip
    assert r.exit_code in (0, 1, 3), r.output  # 3: roundtrip without history cannot be judged
    _no_control(r.output)
    assert "\\x1b[31mRED" in r.output
    for path in (junit, summary):
        _no_control(path.read_text())
    ET.parse(junit)  # still well-formed XML
    r = runner.invoke(app, ["check", "--baseline", HOSTILE, "--run", "rB", "--db", str(db)])
    assert r.exit_code == 2 and r.output.startswith("error: ")  # an error message quoting stored text
    _no_control(r.output)


def test_a_label_that_moves_shows_on_its_new_run_only(db: Path, tmp_path: Path) -> None:
    con = connect(db)
    try:
        labels.set_label(con, "rA", "nightly")  # what `moelab run --label nightly` does after the run
    finally:
        con.close()
    r = CliRunner().invoke(app, ["label", "rB", "nightly", "--db", str(db)])
    assert r.exit_code == 0 and "moved from run rA" in r.output, r.output
    con = connect(db, read_only=True)
    try:
        assert labels.names_by_run(con) == {"rB": ["nightly"], "rA": []}
    finally:
        con.close()
    runs = CliRunner().invoke(app, ["runs", "--db", str(db)]).output
    line_a = next(line for line in runs.splitlines() if "rA" in line)
    line_b = next(line for line in runs.splitlines() if "rB" in line)
    assert "nightly" in line_b and "nightly" not in line_a
    md = write_report(db, ["rA", "rB"], tmp_path / "r.md", fmt="md").read_text()
    assert md.count("nightly") >= 1
    for line in md.splitlines():
        if "nightly" in line:
            assert "rA" not in line, line


def test_control_characters_in_a_new_label_are_refused(db: Path) -> None:
    r = CliRunner().invoke(app, ["label", "rB", HOSTILE, "--db", str(db)])
    assert r.exit_code == 2 and "control characters" in r.output
    _no_control(r.output)
