"""`moelab run --list-cases`: the case ids of a suite for the chosen backends and flags, nothing run."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.spec import LaunchSpec
from moelab.plan.case_list import NOT_RUN, case_rows, planned_kind
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
    # on CPU ranks (gloo) the SM count cannot be set: that case is marked before anything runs, and why
    assert "2 cases (1 to run, 1 not); run some with --case ID" in result.output
    line = next(x for x in result.output.splitlines() if cases[1].case_id in x)
    assert "unsupported [1]" in line
    assert "[1] SM control needs NCCL; gloo has none (run sms = default)" in result.output
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
    # with the launch, what the backend knows before any rank starts: gloo has no SM control, NCCL has
    on_cpu = case_rows(cases, LaunchSpec(device="cpu"))
    assert [r[3] for r in on_cpu] == ["to run"] + [
        "unsupported: SM control needs NCCL; gloo has none (run sms = default)"
    ] * 4
    assert [r[3] for r in case_rows(cases, LaunchSpec(device="cuda"))] == ["to run"] * 5
    assert [planned_kind(c, LaunchSpec(device="cpu")) for c in cases] == ["a2a"] + [NOT_RUN] * 4
