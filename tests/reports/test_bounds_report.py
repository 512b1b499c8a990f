"""% of bound beside % of measured peak in the report, `moelab compare` and `moelab run`'s table, and a run
at a published configuration beside the published figure (moelab.reports.bounds)."""

from __future__ import annotations

from math import comb
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.cli.run_cmd import print_run_summary
from moelab.core.peaks import MeasuredPeak, write_peaks
from moelab.model.links import PeakTable
from moelab.model.stored import case_bound
from moelab.model.traffic import FAMILIES
from moelab.reports.bounds import stored_combine_dtype
from moelab.reports.html import load
from moelab.store.db import connect
from moelab.store.ingest import ingest
from tests.synthetic_runs import BackendModel, RunModel, write_run

PEER_GBPS = 600.0  # above the table's 478 GB/s for H200: the bound takes the measured figure


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    path = root / "b.duckdb"
    two = (BackendModel(name="nccl-a2a", peak_gbps=200), BackendModel(name="deepep", peak_gbps=400))
    measured = write_run(
        root / "runs", RunModel(run_id="measured", gpu_name="NVIDIA H200", backends=two, iters=8)
    )
    write_peaks(
        measured / "peaks.json",
        [
            MeasuredPeak(name="peer_copy_shift1", gbps=PEER_GBPS, bytes=1 << 28, definition="peer copy"),
            MeasuredPeak(name="a2a_remote", gbps=200.0, bytes=1 << 27, definition="a2a"),
        ],
    )
    datasheet = write_run(
        root / "runs", RunModel(run_id="datasheet", gpu_name="NVIDIA H200", backends=two[:1], iters=8)
    )
    published = write_run(
        root / "runs",
        RunModel(
            run_id="published",
            gpu_name="NVIDIA H800",
            backends=(BackendModel(name="deepep", peak_gbps=150),),
            world=8,
            hidden=7168,
            tokens=(4096,),
            experts_per_rank=32,
            dtype="fp8",
            iters=6,
            created_at="2026-11-23T07:00:00+00:00",
        ),
    )
    con = connect(path)
    for run_dir in (measured, datasheet, published):
        ingest(con, run_dir)
    con.close()
    return path


def _results(db: Path, ids: list[str]) -> list[dict]:  # type: ignore[type-arg]
    con = connect(db, read_only=True)
    try:
        return load(con, ids, draw=False).results
    finally:
        con.close()


def test_every_measured_op_has_its_bound_from_the_runs_measured_peaks(db: Path) -> None:
    rows = _results(db, ["measured"])
    dispatch = next(r for r in rows if r["backend"] == "nccl-a2a" and r["op"] == "dispatch")
    # one token per rank reaches the other rank unless all 8 of its experts are this rank's: 1 - C(8,8)/C(16,8)
    remote_rows = 512 * (1 - 1 / comb(16, 8))
    expected = remote_rows * 1024 * 2 / (PEER_GBPS * 1e3) + 2.0 + 1.0  # bytes / measured peer copy + latency
    assert dispatch["bound_us"] == pytest.approx(expected)
    assert dispatch["frac_bound"] == pytest.approx(expected / dispatch["median_us"])
    assert (
        "measured link capacity of run measured" in dispatch["bound_links"]
        and dispatch["bound_family"] == "flat"
    )
    roundtrip = next(r for r in rows if r["backend"] == "deepep" and r["op"] == "roundtrip")
    assert roundtrip["bound_family"] == "hierarchical" and roundtrip["bound_us"] == pytest.approx(
        2 * expected
    )
    assert all(0 < r["frac_bound"] < 1 for r in rows)


def test_a_measured_figure_under_the_tables_rate_leaves_the_tables_rate(db: Path) -> None:
    """The bound takes the larger of the measured figure and the table's rate, so it stays a bound."""
    rows = _results(db, ["datasheet"])
    table = case_bound(rows[0], rows[0]["op"], "NVIDIA H200", None, PeakTable())
    low = case_bound(rows[0], rows[0]["op"], "NVIDIA H200", 300.0, PeakTable())
    high = case_bound(rows[0], rows[0]["op"], "NVIDIA H200", 900.0, PeakTable())
    assert table is not None and low is not None and high is not None
    assert low.time_us == table.time_us and "above the measured 300 GB/s" in low.links
    assert not low.intra_measured and high.intra_measured and high.time_us < table.time_us


def test_without_measured_peaks_the_datasheet_gives_the_bound(db: Path) -> None:
    rows = _results(db, ["datasheet"])
    assert all("table H200" in r["bound_links"] for r in rows)
    same = case_bound(rows[0], rows[0]["op"], "NVIDIA H200", None, PeakTable())
    assert same is not None and same.time_us == rows[0]["bound_us"]
    assert case_bound(rows[0], rows[0]["op"], None, None, PeakTable()) is None  # a CPU run has no bound
    plugin = case_bound(rows[0] | {"backend": "my-plugin"}, rows[0]["op"], "NVIDIA H200", None, PeakTable())
    assert (
        plugin is not None and plugin.family.endswith("(fastest family)") and plugin.time_us <= same.time_us
    )


def test_report_shows_percent_of_bound_beside_percent_measured(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = CliRunner().invoke(
        app,
        [
            "report",
            "--db",
            str(db),
            "--run",
            "measured",
            "--run",
            "datasheet",
            "--format",
            "md",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "| % measured | bound | % bound |" in text
    assert "measured: nvlink 600 GB/s: measured link capacity of run measured" in text
    assert "datasheet: nvlink 478 GB/s: table H200" in text
    html = tmp_path / "r.html"
    assert (
        CliRunner().invoke(app, ["report", "--db", str(db), "--run", "measured", "-o", str(html)]).exit_code
        == 0
    )
    assert "<th>% bound</th>" in html.read_text()


def test_compare_has_percent_of_bound(db: Path) -> None:
    res = CliRunner().invoke(app, ["compare", "--db", str(db), "--run", "measured", "--by", "backend"])
    assert res.exit_code == 0, res.output
    assert "nccl-a2a % bound" in res.stdout and "deepep % bound" in res.stdout


def test_run_summary_prints_percent_measured_and_bound(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    print_run_summary(db, "measured")
    out = capsys.readouterr().out
    assert "% measured" in out and "% bound" in out
    line = next(x for x in out.splitlines() if "nccl-a2a" in x and "dispatch" in x)
    assert line.rstrip().rstrip("│").rstrip().endswith("%")


def test_a_run_at_a_published_configuration_sits_beside_the_published_figure(
    db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "p.md"
    res = CliRunner().invoke(
        app, ["report", "--db", str(db), "--run", "published", "--format", "md", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "| published row |" in text
    for row in ("deepep-v1/normal/ep8/dispatch", "deepep-v1/normal/ep8/combine"):
        assert row in text
    line = next(x for x in text.splitlines() if "deepep-v1/normal/ep8/dispatch" in x)
    assert "| nvl_recv | 153 |" in line and "3b1045d" in line and "H800" in line


def test_every_built_in_backend_has_a_family() -> None:
    from moelab.backends import registry

    assert all(registry.load(name).dispatch_family in FAMILIES for name in registry.BUILTIN)
    assert registry.bound_traits("mxfp8-a2a", {}) == ("flat", "mxfp8")
    assert registry.bound_traits("mxfp8-a2a", {"combine_impl": "bf16"}) == ("flat", "bf16")
    assert registry.bound_traits("no-such-backend", {}) == (None, "bf16")
    # a stored case says its combine payload through the bytes a combine row carried (fp8 with
    # per-128 float32 scales and mxfp8 carry the same bytes: the bound is the same either way)
    assert [stored_combine_dtype(7168, b) for b in (14336, 7392, None)] == ["bf16", "fp8", "bf16"]
