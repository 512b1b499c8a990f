"""`moelab run --list-cases`: the case ids of a suite for the chosen backends and flags, nothing run."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.plan.case_list import case_rows
from moelab.suites.loader import expand, load_suite


def test_list_cases_prints_every_id_and_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    args = [
        "run",
        "--cpu",
        "--list-cases",
        "--experts-per-rank",
        "8",
        "--sms",
        "default,16",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cases = expand(
        load_suite("dispatch-combine"), ["nccl-a2a"], 2, {"experts_per_rank": [8], "sms": ["default", 16]}, {}
    )
    assert len(cases) == 2
    for c in cases:
        assert c.case_id in result.output
    assert "2 cases; run some with --case ID" in result.output
    assert not out.exists()
    picked = CliRunner().invoke(app, [*args, "--case", cases[1].case_id])
    assert (
        picked.exit_code == 0 and cases[0].case_id not in picked.output and cases[1].case_id in picked.output
    )


def test_case_rows_say_what_happens() -> None:
    cases = expand(load_suite("dispatch-combine"), ["nccl-a2a"], 2, {"experts_per_rank": [8]}, {})
    rows = case_rows(cases)
    assert [r[1] for r in rows] == [c.case_id for c in cases]
    assert all(r[3] == "to run" or r[3].startswith("skipped: ") for r in rows)
    assert "hidden 8192" in rows[0][2]
