"""Outputs that read right: `runs` says how many cases were not run (unsupported) apart from failed, the
report suggests no SM sweep right after one whose SM counts were unsupported, `--routing`'s help names
every routing kind."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.workload import ROUTING_KINDS
from moelab.reports.html import ReportData
from tests.cli.test_fits_the_terminal import h200  # noqa: F401  (the 2×H200 export, imported)


def test_runs_counts_not_run_apart_from_failed(h200: Path) -> None:  # noqa: F811
    r = CliRunner().invoke(app, ["runs", "--db", str(h200)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "not run" in r.stdout and "failed" in r.stdout
    # 20261122T070330Z-80e91c: 20 ok, 8 unsupported, 8 failed, 36 cases
    line = next(x for x in r.stdout.splitlines() if "20261122T070330Z-80e91c" in x)
    assert [c for c in line.split() if c != "│"][-4:] == ["20", "8", "8", "36"], line


def _data(results: list[dict], not_measured: list[dict]) -> ReportData:
    return ReportData(
        runs=[], environment=[], results=results, not_measured=not_measured, jobs=[], definitions=[]
    )


def test_no_sm_sweep_suggested_after_one() -> None:
    ok = {"run_id": "r", "backend": "nccl-a2a", "op": "dispatch", "sms": None, "tokens_per_rank": 32}
    measured = [{**ok, "case_id": "h128-t32-k8-e8-uniform-s0-bf16-smdef"}]
    unsupported = [
        {"run_id": "r", "backend": "nccl-a2a", "case_id": f"h128-t32-k8-e8-uniform-s0-bf16-sm{n}"}
        for n in (8, 16)
    ]
    assert not any("SM sweep" in a for a in _data(measured, unsupported).absent)
    assert any("SM sweep" in a for a in _data(measured, []).absent)  # control: one SM count, suggested


def test_routing_help_names_every_kind() -> None:
    r = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    line = next(x for x in r.stdout.splitlines() if "--routing" in x)
    assert all(kind in line for kind in ROUTING_KINDS), line


def test_run_lists_take_commas(h200: Path, tmp_path: Path) -> None:  # noqa: F811
    """--run a,b, as every other list flag; compare, report and db export alike."""
    two = "20261122T070145Z-3c8758,20261122T070330Z-80e91c"
    r = CliRunner().invoke(
        app, ["db", "export", "--db", str(h200), "--run", two, "--out", str(tmp_path / "e")]
    )
    assert r.exit_code == 0, r.output
    import json

    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["runs"] == two.split(",")
    r = CliRunner().invoke(
        app, ["report", "--db", str(h200), "--run", two, "-o", str(tmp_path / "r.md"), "--format", "md"]
    )
    assert r.exit_code == 0, r.output
    assert all(run in (tmp_path / "r.md").read_text() for run in two.split(","))


def test_side_by_side_reference_has_figures(h200: Path) -> None:  # noqa: F811
    """The report's side-by-side takes as reference the group that measured the most matched cases (it
    took the first by name, deepep, which measured none of the 2×H200 run's matched cases: every ratio —)."""
    import duckdb

    from moelab.reports.html import load

    with duckdb.connect(str(h200), read_only=True) as con:
        ids = [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()]
        data = load(con, ids, draw=False)
    assert data.comparisons
    for t in data.comparisons:
        measured = {g: sum(g in row.cells for row in t.rows) for g in t.groups}
        assert measured[t.reference] == max(measured.values()) > 0, (t.reference, measured)
        assert all(n > 0 for n in measured.values())  # no group without a matched case
