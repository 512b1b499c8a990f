"""`moelab compare` over many runs: narrowing the runs in SQL changes no cell, run-like groups are paged,
and the printed table is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moelab.cli.compare_cmd import compare
from moelab.model.links import PeakTable
from moelab.reports import compare as cmp
from moelab.reports import compare_select, hardware, query
from moelab.store.db import connect
from moelab.store.labels import set_label
from tests.synthetic_runs import BackendModel, RunModel, build_db

GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
NCCLS = ("2.27.3", "2.28.9", "2.29.1")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cmp-scale")
    path = root / "many.duckdb"
    models = []
    for i in range(12):
        backends = (BackendModel(name="nccl-a2a", peak_gbps=200 + i),)
        if i % 3 == 0:
            backends += (BackendModel(name="deepep", peak_gbps=400 + i, knobs={"num_max_tokens": 256}),)
        models.append(
            RunModel(
                run_id=f"run{i:02d}",
                created_at=f"2026-11-{10 + i:02d}T07:00:00+00:00",
                gpu_name=GPUS[i % 2],
                nccl=NCCLS[i % 3],
                label="nightly" if i % 4 else f"release-{i}",
                backends=backends,
                tokens=(256, 1024) if i % 2 else (256,),
                sms=(None,),
                iters=6,
                seed=i,
            )
        )
    build_db(path, root / "runs", models)
    con = connect(path)
    set_label(con, "run05", "golden")
    con.close()
    return path


def _cells(table: cmp.CompareTable) -> dict[tuple[object, ...], tuple[str, float]]:
    return {
        (row.label, row.op, row.sms, g): (c.run_id, c.median_us)
        for row in table.rows
        for g, c in row.cells.items()
    }


@pytest.mark.parametrize("by", ["backend", "gpu", "nccl", "driver", "torch", "label"])
def test_narrowing_the_runs_changes_no_cell(db: Path, by: str) -> None:
    con = connect(db, read_only=True)
    try:
        ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
        query.select_runs(con, ids)
        env = query.environment(con)
        links = hardware.job_links(query.health_snapshots(con), env, PeakTable())
        full = cmp.build(query.results(con), env, query.runs(con), links, by=by)
        label_of = compare_select.label_groups(con) if by == "label" else None
        kept = compare_select.newest_runs_only(con, by, label_of)
        narrow = cmp.build(query.results(con), query.environment(con), query.runs(con), links, by=by)
    finally:
        con.close()
    assert kept < len(ids)
    assert narrow.groups == full.groups and _cells(narrow) == _cells(full)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("compare")(compare)
    app.command("noop")(lambda: None)
    return app


def test_by_run_is_paged_with_the_reference_on_every_page(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moelab.cli.common import console

    monkeypatch.setattr(console, "width", 400)  # figure columns never wrap: give them room to show whole
    shown = []
    for page in (1, 2, 3, 4):
        r = CliRunner().invoke(
            _app(), ["compare", "--db", str(db), "--by", "run", "--groups", "4", "--page", str(page)]
        )
        assert r.exit_code == 0, r.output
        assert f"page {page} of 4: {4 if page < 4 else 3} of 12 groups shown" in r.stdout
        assert "run00 GB/s" in r.stdout  # the reference (time columns print their unit per cell)
        shown.append({f"run{i:02d}" for i in range(1, 12) if f"run{i:02d} GB/s" in r.stdout})
    assert set().union(*shown) == {f"run{i:02d}" for i in range(1, 12)}
    assert [len(s) for s in shown] == [3, 3, 3, 2]


def test_by_label_groups_runs_sharing_a_label(db: Path) -> None:
    r = CliRunner().invoke(_app(), ["compare", "--db", str(db), "--by", "label", "--groups", "20"])
    assert r.exit_code == 0, r.output
    assert "ratios against nightly" in r.stdout and "--page N" not in r.stdout
    con = connect(db, read_only=True)
    try:
        query.select_runs(con, ["run04", "run05"])
        assert compare_select.label_groups(con) == {"run04": "release-4", "run05": "nightly, golden"}
    finally:
        con.close()


def test_printed_rows_are_bounded(db: Path) -> None:
    r = CliRunner().invoke(_app(), ["compare", "--db", str(db), "--by", "gpu", "--rows", "2"])
    assert r.exit_code == 0, r.output
    assert "more rows not printed (--rows N, or --html for all)" in r.stdout
