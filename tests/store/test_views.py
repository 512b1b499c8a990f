"""The judged views read every column of the tables they join, on every DuckDB that pyproject allows: DuckDB
1.x binds a view's columns when it is created and keeps them after a later migration's ALTER TABLE
(`Contents of view were altered: types don't match!`). The minimum-versions lane of .ci/run runs these on
the oldest DuckDB allowed, where they fail without the views being recreated after every migration."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.store.db import connect
from moelab.store.schema import LATEST_VERSION, VIEWS
from tests.hostile.world import Outcome, World, rows_of
from tests.synthetic_runs import BackendModel, RunModel, write_run

TWO = (BackendModel(name="nccl-a2a"), BackendModel(name="mxfp8-a2a", alpha_us=30.0))
BASE = {"cases_judged": "cases", "results_judged": "results"}


def _columns(con: duckdb.DuckDBPyConnection, name: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {name}").fetchall()]


def moelab(*argv: str) -> Outcome:
    """The command as typed (in this process: each subprocess would import torch again)."""
    result = CliRunner().invoke(app, list(argv))
    return Outcome(result.exit_code, result.stdout, result.stderr)


def test_every_view_has_its_tables_columns_after_all_migrations(tmp_path: Path) -> None:
    con = connect(tmp_path / "fresh.duckdb")
    try:
        assert {v.name for v in VIEWS} == set(BASE)
        for view, table in BASE.items():
            assert _columns(con, view) == _columns(con, table)
            con.execute(f"SELECT * FROM {view}").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("version", [8, 10])
def test_a_store_an_older_moelab_migrated_reads_its_views_after_db_migrate(
    tmp_path: Path, version: int
) -> None:
    """A store at schema 8-10 whose views were bound at schema 8 (as every moelab before schema 11 left
    them): `moelab db migrate` rebinds them, then a repeated run (results' columns of schema 10) is stored,
    reported and compared through the command."""
    world = World(tmp_path)
    old = world.db_at_version(version)
    migrated = moelab("db", "migrate", "--db", str(old))
    assert migrated.code == 0, migrated.stderr
    assert f"to {LATEST_VERSION}" in migrated.stdout
    run = write_run(tmp_path / "runs", RunModel(run_id="again", backends=TWO, repeats=2, iters=8))
    stored = moelab("ingest", str(run), "--db", str(old))
    assert stored.code == 0, stored.stderr
    assert rows_of(old, "SELECT count(*), min(repeats) FROM results_judged WHERE run_id = 'again'")[0][1] == 2
    report = moelab("report", "--run", "again", "-o", str(tmp_path / "r.html"), "--db", str(old))
    assert report.code == 0 and "Traceback" not in report.stderr, report.stderr
    compare = moelab("compare", "--run", "again", "--db", str(old))
    assert compare.code == 0 and "Traceback" not in compare.stderr, compare.stderr
