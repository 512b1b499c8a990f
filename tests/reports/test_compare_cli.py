"""`moelab compare`: backends and GPU generations side by side, matched on workload and SMs."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moelab.cli.compare_cmd import compare
from moelab.model.links import PeakTable
from moelab.reports import compare as cmp
from moelab.reports import hardware, query
from moelab.store.db import connect
from tests.synthetic_runs import BackendModel, RunModel, build_db

TWO = (
    BackendModel(name="nccl-a2a", peak_gbps=200),
    BackendModel(name="deepep", peak_gbps=400, knobs={"num_max_tokens": 256}),
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cmp")
    path = root / "cmp.duckdb"
    common = dict(hidden=4096, tokens=(1024,), sms=(16, 24), iters=10, noise=0.001)
    build_db(path, root / "runs", [
        RunModel(run_id="h100", created_at="2026-11-20T07:00:00+00:00", gpu_name="NVIDIA H100 80GB HBM3", label="h100-main", backends=TWO[:1], **common),  # type: ignore[arg-type]
        RunModel(run_id="b200", created_at="2026-11-21T07:00:00+00:00", gpu_name="NVIDIA B200", nccl="2.29.1", backends=(BackendModel(name="nccl-a2a", peak_gbps=380),), **common),  # type: ignore[arg-type]
        RunModel(run_id="h200", created_at="2026-11-22T07:00:00+00:00", gpu_name="NVIDIA H200", backends=TWO, **common),  # type: ignore[arg-type]
    ])  # fmt: skip
    return path


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("compare")(compare)
    app.command("noop")(lambda: None)
    return app


def _table(db: Path, ids: list[str], by: str, metric: str = "nvl_recv") -> cmp.CompareTable:
    con = connect(db, read_only=True)
    try:
        query.select_runs(con, ids)
        env = query.environment(con)
        links = hardware.job_links(query.health_snapshots(con), env, PeakTable())
        return cmp.build(query.results(con), env, query.runs(con), links, by=by, metric=metric)
    finally:
        con.close()


def test_by_backend_matches_cases_across_knobs(db: Path) -> None:
    t = _table(db, ["h200"], "backend")
    assert t.groups == ["deepep num_max_tokens=256", "nccl-a2a"]
    assert len(t.rows) == 2 * 3  # two SM counts x three ops, each measured by both
    row = next(r for r in t.rows if r.op == "dispatch" and r.sms == 24)
    ratio = t.ratio(row, "nccl-a2a")
    assert ratio is not None and 0.3 < ratio < 0.7  # nccl-a2a at about half deepep's bandwidth


def test_by_gpu_normalises_to_each_link_peak(db: Path) -> None:
    t = _table(db, ["h100", "b200", "h200"], "gpu", "nvl_remote")
    assert set(t.groups) == {"NVIDIA H100 80GB HBM3", "NVIDIA B200", "NVIDIA H200"}
    row = next(r for r in t.rows if r.op == "dispatch" and r.sms == 24 and r.label.startswith("nccl-a2a"))
    h100, b200 = row.cells["NVIDIA H100 80GB HBM3"], row.cells["NVIDIA B200"]
    assert h100.frac_peak == pytest.approx(h100.gbps / 478.08)  # type: ignore[operator]
    assert b200.frac_peak == pytest.approx(b200.gbps / 900.0)  # type: ignore[operator]
    assert b200.gbps > h100.gbps and b200.frac_peak < h100.frac_peak * 1.2  # type: ignore[operator]
    assert all(c.frac_peak is None for r in t.rows if r.op == "roundtrip" for c in r.cells.values())


def test_percent_peak_is_remote_over_the_peak_whatever_the_metric(db: Path) -> None:
    """One % peak definition everywhere: nvl_remote over the per-direction peak, not the column's metric."""
    recv, remote = (_table(db, ["h100"], "backend", m) for m in ("nvl_recv", "nvl_remote"))
    for a, b in zip(recv.rows, remote.rows, strict=True):
        for g, cell in a.cells.items():
            assert cell.frac_peak == b.cells[g].frac_peak
            if cell.frac_peak is not None:
                assert b.cells[g].frac_peak == pytest.approx(b.cells[g].gbps / 478.08)  # type: ignore[operator]
                assert cell.gbps > b.cells[g].gbps  # type: ignore[operator]


def test_cli_terminal_table_and_html(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp.html"
    r = CliRunner().invoke(
        _app(),
        [
            "compare",
            "--db",
            str(db),
            "--by",
            "nccl",
            "--run",
            "h100-main",
            "--run",
            "b200",
            "--html",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "2.28.9" in r.output and "2.29.1" in r.output and "vs 2.28.9" in r.output
    html = out.read_text()
    assert '<section id="compare-nccl">' in html and html.count("<tr>") == 2 + 6 and "<script" not in html


def test_cli_default_is_backends_of_newest_run(db: Path) -> None:
    r = CliRunner().invoke(_app(), ["compare", "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "deepep" in r.output and "nccl-a2a" in r.output


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--by", "colour"], "cannot compare by"),
        (["--run", "h100"], "only one backend"),
        (["--by", "gpu", "--run", "h100", "--metric", "bogus"], "unknown metric"),
        (["--by", "gpu", "--reference", "TPU"], "reference"),
        (["--run", "nope"], "neither a label nor a run id"),
    ],
)
def test_cli_usage_errors(db: Path, argv: list[str], message: str) -> None:
    r = CliRunner().invoke(_app(), ["compare", "--db", str(db), *argv])
    assert r.exit_code == 2 and message in r.output, r.output


def test_help_has_an_example() -> None:
    r = CliRunner().invoke(_app(), ["compare", "--help"])
    assert r.exit_code == 0 and "Example: moelab compare" in r.output
