"""`moelab compare` knows its noise (issue 29, item 3): every ratio with its interval over processes,
"indistinguishable" where it covers 1, and a ranking only where the slowest and the fastest rank agree; one
process a side names no winner (issue 38)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.model.links import PeakTable
from moelab.reports import compare as cmp
from moelab.reports import hardware, query
from moelab.store.db import connect
from tests.synthetic_runs import BackendModel, RunModel, build_db

BACKENDS = (
    BackendModel(name="nccl-a2a"),  # the reference
    BackendModel(name="mxfp8-a2a"),  # the same speed: indistinguishable
    BackendModel(name="deepep", peak_gbps=450.0),  # clearly faster
    BackendModel(name="hybrid-ep", rank_skew=0.05),  # faster on its fastest rank, slower on its slowest
)
COMMON = dict(backends=BACKENDS, tokens=(1024,), sms=(None,), iters=30, noise=0.01)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cmpci")
    path = root / "c.duckdb"
    build_db(
        path,
        root / "runs",
        [
            RunModel(run_id="once", created_at="2026-11-20T07:00:00+00:00", seed=4, **COMMON),  # type: ignore[arg-type]
            RunModel(
                run_id="rep",
                created_at="2026-11-21T07:00:00+00:00",
                seed=5,
                repeats=3,
                process_noise=0.01,
                **COMMON,
            ),  # type: ignore[arg-type]
        ],
    )
    return path


def _table(db: Path, run: str) -> cmp.CompareTable:
    con = connect(db, read_only=True)
    try:
        query.select_runs(con, [run])
        env = query.environment(con)
        return cmp.build(
            query.results(con),
            env,
            query.runs(con),
            hardware.job_links(query.health_snapshots(con), env, PeakTable()),
            by="backend",
            reference="nccl-a2a",
            processes=query.process_medians(con),
        )
    finally:
        con.close()


def _ranking(t: cmp.CompareTable, group: str, op: str = "dispatch") -> cmp.Ranking:
    row = next(r for r in t.rows if r.op == op)
    found = t.ranking(row, group)
    assert found is not None
    return found


def test_every_ratio_has_its_interval_with_repeats(db: Path) -> None:
    t = _table(db, "rep")
    for row in t.rows:
        for g in ("mxfp8-a2a", "deepep", "hybrid-ep"):
            r = t.ranking(row, g)
            assert r is not None and r.interval is not None and r.interval.low <= r.ratio <= r.interval.high
            ci = t.ratio_interval(row, g)
            bw = t.ratio(row, g)
            if bw is not None:
                assert ci is not None and ci.low <= bw <= ci.high
                assert t.ratio_text(row, g) == f"{bw:.3g} {ci.text()}"


def test_indistinguishable_faster_and_a_refused_ranking(db: Path) -> None:
    t = _table(db, "rep")
    for op in ("dispatch", "combine"):
        same = _ranking(t, "mxfp8-a2a", op)
        assert same.interval is not None and same.interval.covers(1.0) and same.verdict == "indistinguishable"
        fast = _ranking(t, "deepep", op)
        assert fast.verdict == "faster" and fast.interval is not None and fast.interval.high < 1.0
        skew = _ranking(t, "hybrid-ep", op)
        assert skew.ratio > 1.0 and skew.fast_ratio is not None and skew.fast_ratio < 1.0
        assert skew.verdict == "not ranked: ranks disagree"


def test_one_process_gives_ratios_without_intervals(db: Path) -> None:
    t = _table(db, "once")
    fast = _ranking(t, "deepep")
    assert fast.interval is None and fast.verdict == "no interval"  # one process a side: never a winner
    row = next(r for r in t.rows if r.op == "dispatch")
    ratio = t.ratio(row, "deepep")
    assert ratio is not None and t.ratio_text(row, "deepep") == f"{ratio:.3g}"
    assert _ranking(t, "hybrid-ep").verdict == "no interval"


def test_the_cli_shows_intervals_and_verdicts(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moelab.cli.common import console

    monkeypatch.setattr(console, "width", 1000)  # four groups side by side: no cell wraps
    html = tmp_path / "c.html"
    r = CliRunner().invoke(
        app, ["compare", "--db", str(db), "--run", "rep", "--reference", "nccl-a2a", "--html", str(html)]
    )
    assert r.exit_code == 0, r.output
    assert "not ranked: ranks disagree" in html.read_text() and "covers 1" in html.read_text()
    for needle in (
        "indistinguishable",
        "not ranked: ranks disagree",
        "faster",
        "deepep vs nccl-a2a",
        "99% interval over processes (t on log per-process medians)",
    ):
        assert needle in r.output, needle
    assert " [" in r.output and "]" in r.output  # ratios with their interval


def test_the_summary_ranks_with_the_interval_over_processes(db: Path) -> None:
    """The report's and console's summary reads the stored interval over processes where a run has
    repeats (plain fields of the result rows), the within-process noise otherwise."""
    from moelab.reports.summary import interval

    con = connect(db, read_only=True)
    try:
        query.select_runs(con, ["rep", "once"])
        rows = query.results(con)
    finally:
        con.close()
    rep = next(
        r for r in rows if r["run_id"] == "rep" and r["backend"] == "nccl-a2a" and r["op"] == "dispatch"
    )
    once = next(
        r for r in rows if r["run_id"] == "once" and r["backend"] == "nccl-a2a" and r["op"] == "dispatch"
    )
    assert rep["repeats"] == 3 and rep["ci_low_us"] <= rep["median_us"] <= rep["ci_high_us"]
    assert rep["process_cv"] is not None
    e = interval(rep)
    assert e is not None and (e.low_us, e.high_us) == (rep["ci_low_us"], rep["ci_high_us"])
    assert once["repeats"] == 1 and once["ci_low_us"] is None
    e1 = interval(once)
    assert e1 is not None and e1.low_us == pytest.approx(once["median_us"] * (1 - once["noise"]))
