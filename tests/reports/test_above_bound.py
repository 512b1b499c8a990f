"""Any figure above 100% of its bound or peak is a finding: `moelab run`, `moelab report`, `moelab compare`
and the gate (`moelab check`) each flag it with its likely cause (moelab.model.above)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.launch.runner import RunOutcome
from moelab.model.above import CAUSES, TIMING_ARTEFACT, TOPOLOGY_MISMATCH, above_findings
from moelab.store.db import connect
from moelab.store.ingest import ingest
from tests.synthetic_runs import BackendModel, RunModel, write_run

# 2 ranks on one host stored as 2 nodes of 1 GPU (--gpus-per-node 1): the bound assumes a NIC between them
EMULATED = {
    "gpu_name": "NVIDIA H200",
    "gpus_per_node": 1,
    "backends": (BackendModel(name="nccl-a2a", peak_gbps=300),),
}
# one node, faster than NVLink can carry: the time is too short
TOO_FAST = {
    "gpu_name": "NVIDIA H200",
    "backends": tuple(BackendModel(name=n, peak_gbps=5000, alpha_us=0.1) for n in ("nccl-a2a", "deepep")),
    "hidden": 7168,
    "tokens": (4096,),
}


def _store(db: Path, root: Path, run_id: str, **kw: Any) -> None:
    run_dir = write_run(root, RunModel(run_id=run_id, iters=8, **kw))
    con = connect(db)
    try:
        ingest(con, run_dir)
    finally:
        con.close()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("above")
    path = root / "a.duckdb"
    _store(path, root / "runs", "emulated-base", created_at="2026-11-21T07:00:00+00:00", **EMULATED)
    _store(path, root / "runs", "emulated", **EMULATED)
    _store(path, root / "runs", "too-fast", created_at="2026-11-23T07:00:00+00:00", **TOO_FAST)
    return path


def test_causes_from_the_rows_fields() -> None:
    base = {"frac_bound": 2.1, "bound_nodes": 2, "hosts": 1, "bound_nic": "ConnectX-7", "world": 2}
    [f] = above_findings(base)
    assert f.cause == TOPOLOGY_MISMATCH and "ConnectX-7, a NIC the host lacks" in f.why
    assert above_findings(base | {"hosts": 2})[0].cause == TIMING_ARTEFACT
    assert above_findings(base | {"frac_bound": 1.0}) == []  # at the bound is not above it
    peak = above_findings({"frac_remote": 1.05, "peak_basis": "datasheet", "frac_remote_measured": 1.2})
    assert [f.figure for f in peak] == ["% peak", "% measured"] and all(f.cause in CAUSES for f in peak)


def test_report_flags_a_bound_that_assumed_a_nic_the_host_lacks(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = CliRunner().invoke(
        app, ["report", "--db", str(db), "--run", "emulated", "--format", "md", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "above 100% of its bound or peak: topology mismatch" in text
    assert "a NIC the host lacks" in text and "% bound > 100%" in text
    html = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", "--db", str(db), "--run", "too-fast", "-o", str(html)])
    assert res.exit_code == 0, res.output
    assert "timing artefact" in html.read_text()


def test_compare_flags_each_figure_above_its_bound(db: Path, tmp_path: Path) -> None:
    for args, cause in (
        (["--by", "run", "--run", "emulated-base", "--run", "emulated"], "topology mismatch"),
        (["--by", "backend", "--run", "too-fast"], "timing artefact"),
    ):
        html = tmp_path / "c.html"
        res = CliRunner().invoke(app, ["compare", "--db", str(db), *args, "--html", str(html)])
        assert res.exit_code == 0, res.output
        assert "flags: figures above 100% of their bound or peak" in res.stdout and cause in res.stdout
        assert "above 100% of their bound or peak" in html.read_text() and cause in html.read_text()


def test_gate_flags_the_candidate_above_its_bound(db: Path) -> None:
    res = CliRunner().invoke(
        app, ["check", "--db", str(db), "--baseline", "emulated-base", "--run", "emulated"]
    )
    assert "flag: nccl-a2a" in res.stdout and "% bound" in res.stdout and "topology mismatch" in res.stdout


def test_run_console_flags_a_case_above_its_bound(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`moelab run` through the command; its jobs' measurement replaced by a stored synthetic run of the
    same id (a CPU run has no bound), everything after it (store, table, flags, summary) as it is."""
    import moelab.cli.run_cmd as run_cmd

    def execute(spec: Any, runs_root: Path, db_path: Path, **_: Any) -> RunOutcome:
        _store(db_path, runs_root, spec.run_id, **EMULATED)
        return RunOutcome(run_id=spec.run_id, run_dir=runs_root / spec.run_id, jobs={}, ingested=True)

    monkeypatch.setattr(run_cmd, "execute", execute)
    args = ["run", "--cpu", "--experts-per-rank", "8", "--tokens-per-rank", "32", "--hidden", "128"]
    res = CliRunner().invoke(
        app, [*args, "--db", str(tmp_path / "r.duckdb"), "--out", str(tmp_path / "runs")]
    )
    out = res.stdout
    assert "flags (the marks in the table above):" in out, out
    assert "above 100% of its bound or peak: topology mismatch" in out and "a NIC the host lacks" in out


def test_one_percent_peak_definition_in_results_knee_and_chart(tmp_path: Path) -> None:
    """% peak is nvl_remote over the per-direction peak in the results, the knee table and the SM chart."""
    from moelab.reports.html import load

    db = tmp_path / "k.duckdb"
    _store(db, tmp_path / "runs", "sweep", gpu_name="NVIDIA H200", sms=(8, 16, 24, 32))
    con = connect(db, read_only=True)
    try:
        data = load(con, ["sweep"], draw=True)
    finally:
        con.close()
    for k in data.knees:
        best = next(
            r
            for r in data.results
            if r["op"] == k["op"] and r["sms"] == k["best_sms"] and r["backend"] in k["series"]
        )
        assert k["best_gbps"] == best["remote_gbps"] < best["nvl_gbps"]
        assert k["frac_peak"] == pytest.approx(best["frac_remote"])
    assert data.knees and all("nvl_remote GB/s" in c["svg"] for c in data.charts if c["kind"] == "sm")


@given(
    key=st.sampled_from(["frac_bound", "frac_remote", "frac_remote_measured"]),
    fraction=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    nodes=st.integers(1, 16),
    hosts=st.one_of(st.none(), st.integers(1, 16)),
    basis=st.sampled_from(["NVML", "datasheet", "peaks file", None]),
)
def test_any_figure_above_100_percent_is_a_finding_with_a_cause(
    key: str, fraction: float, nodes: int, hosts: int | None, basis: str | None
) -> None:
    row = {key: fraction, "bound_nodes": nodes, "hosts": hosts, "peak_basis": basis, "world": 8}
    found = above_findings(row)
    assert bool(found) == (fraction > 1.0)
    for f in found:
        assert f.cause in CAUSES and f.why and f"{100 * fraction:.0f}%" in f.text()
