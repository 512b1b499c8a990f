"""The regression gate: statistics, decisions on synthetic samples, exit codes, Markdown and JUnit."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moelab.cli.check_cmd import check
from moelab.cli.label_cmd import label
from moelab.store.db import connect
from moelab.store.export import export_runs
from tests.gate.history_runs import history
from tests.synthetic_runs import RunModel, build_db

# --- end to end through the CLI ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gate_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gate")
    db = root / "gate.duckdb"
    base = dict(tokens=(256, 1024), sms=(None,), iters=40, noise=0.005)
    build_db(db, root / "runs", [*history(8, **base),
        RunModel(run_id="base", created_at="2026-11-20T07:00:00+00:00", label="main", seed=1, **base),  # type: ignore[arg-type]
        RunModel(run_id="same", created_at="2026-11-21T07:00:00+00:00", seed=2, **base),  # type: ignore[arg-type]
        RunModel(run_id="slow", created_at="2026-11-22T07:00:00+00:00", seed=3, slowdown=1.10, **base),  # type: ignore[arg-type]
    ])  # fmt: skip
    return db


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("check")(check)
    app.command("label")(label)
    return app


def test_check_exit_codes(gate_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    runner = CliRunner()
    ok = runner.invoke(_app(), ["check", "--db", str(gate_db), "--baseline", "main", "--run", "same"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(_app(), ["check", "--db", str(gate_db), "--baseline", "main"])  # newest run: slow
    assert bad.exit_code == 1, bad.output
    assert "regression" in bad.output and "FAIL" in bad.output
    for argv in (["check", "--db", str(gate_db)], ["check", "--db", str(gate_db), "--baseline", "nope"],
                 ["check", "--db", str(gate_db), "--baseline", "main", "--threshold", "-3"],
                 ["check", "--db", str(tmp_path / "none.duckdb"), "--baseline", "main"],
                 ["check", "--db", str(gate_db), "--baseline", "main", "--run", "base"]):  # fmt: skip
        r = runner.invoke(_app(), argv)
        assert r.exit_code == 2, (argv, r.output)


def test_check_against_export_folder_with_summary_and_junit(
    gate_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    con = connect(gate_db, read_only=True)
    try:
        export_runs(con, tmp_path / "baseline", "parquet", ["base"])
    finally:
        con.close()
    step = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    junit = tmp_path / "check.xml"
    r = CliRunner().invoke(
        _app(),
        [
            "check",
            "--db",
            str(gate_db),
            "--baseline",
            str(tmp_path / "baseline"),
            "--run",
            "slow",
            "--junit",
            str(junit),
        ],
    )
    assert r.exit_code == 1, r.output
    md = step.read_text()
    assert md.startswith("## moelab check") and "FAIL" in md
    table_rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert len(table_rows) == 1 + 6  # header + 2 cases x 3 ops, all slower by 10%
    assert sum("❌ regression" in ln for ln in table_rows) == 6  # every op of both cases
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert root.tag == "testsuites" and suite is not None
    cases = suite.findall("testcase")
    failures = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("tests", "-1")) == len(cases) == 6
    assert int(suite.get("failures", "-1")) == len(failures) == 6
    assert int(suite.get("skipped", "-1")) == sum(c.find("skipped") is not None for c in cases)
    assert all(f.find("failure").get("type") == "regression" for f in failures)  # type: ignore[union-attr]


def test_clean_check_summary_and_junit(gate_db: Path, tmp_path: Path) -> None:
    summary, junit = tmp_path / "s.md", tmp_path / "j.xml"
    r = CliRunner().invoke(
        _app(),
        [
            "check",
            "--db",
            str(gate_db),
            "--baseline",
            "base",
            "--run",
            "same",
            "--summary",
            str(summary),
            "--junit",
            str(junit),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "PASS" in summary.read_text()
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "0" and int(root.get("tests", "0")) == 6


def test_missing_and_broken_cases(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    quiet = dict(tokens=(256, 1024), iters=20, noise=0.005)
    build_db(db, tmp_path / "runs", [*history(6, **quiet),
        RunModel(run_id="b", created_at="2026-11-20T07:00:00+00:00", tokens=(256, 1024), iters=20, noise=0.005),
        RunModel(run_id="fewer", created_at="2026-11-21T07:00:00+00:00", tokens=(256,), iters=20, seed=5, noise=0.005),
        RunModel(run_id="wrong", created_at="2026-11-22T07:00:00+00:00", tokens=(256, 1024), iters=20, incorrect=("nccl-a2a",)),
    ])  # fmt: skip
    runner = CliRunner()
    r = runner.invoke(_app(), ["check", "--db", str(db), "--baseline", "b", "--run", "fewer"])
    assert r.exit_code == 0 and "missing" in r.output, r.output
    r = runner.invoke(
        _app(), ["check", "--db", str(db), "--baseline", "b", "--run", "fewer", "--fail-on-missing"]
    )
    assert r.exit_code == 1, r.output
    r = runner.invoke(_app(), ["check", "--db", str(db), "--baseline", "b", "--run", "wrong"])
    assert r.exit_code == 1 and "broken" in r.output, r.output


def test_label_moves_and_baseline_resolves_it(gate_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(gate_db.read_bytes())
    runner = CliRunner()
    assert runner.invoke(_app(), ["label", "slow", "main", "--db", str(db)]).exit_code == 0
    # the labels table wins over runs.label: "main" now names the slow run, so slow vs main matches itself
    r = runner.invoke(_app(), ["check", "--db", str(db), "--baseline", "main", "--run", "slow"])
    assert r.exit_code == 2 and "same run" in r.output
