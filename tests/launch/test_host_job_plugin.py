"""A host job is its own kind of backend: the runner has the launching host run it (no ranks), a plugin's
as a built-in's, and health's judgements of moelab's samples leave its results (the tool's own timing) out,
by its type, not its name."""

from __future__ import annotations

from pathlib import Path

import duckdb
from typer.testing import CliRunner

from moelab.store.db import connect
from moelab.store.run_history import drift_flags, spread_flags, tool_timed_backends
from tests.synthetic_runs import BackendModel, RunModel, build_db

SMALL = ["--hidden", "256", "--tokens-per-rank", "64", "--experts-per-rank", "4", "--no-health", "--quiet"]


def test_the_launching_host_runs_a_plugin_host_job(plugin_path: Path, tmp_path: Path) -> None:
    from moelab.cli.main import app

    args = ["run", "--cpu", "--backend", "test-host", *SMALL, "--out", str(tmp_path / "runs")]
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0 and "# test-host: run by this process on the launching host" in dry.stdout
    res = CliRunner().invoke(app, [*args, "--db", str(tmp_path / "h.duckdb")])
    assert res.exit_code == 0, res.output
    with duckdb.connect(str(tmp_path / "h.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT DISTINCT backend, op, median_us FROM results").fetchall()
    assert rows == [("test-host", "alltoall", 100.0)]


def test_drift_and_spread_leave_host_jobs_out(plugin_path: Path, tmp_path: Path) -> None:
    """Two backends slowed by the same 20% in run c: only the one run on moelab's ranks is judged."""
    db = tmp_path / "d.duckdb"
    both = (BackendModel(name="test-host"), BackendModel(name="test-raise"))
    build_db(
        db,
        tmp_path / "runs",
        [
            RunModel(
                run_id=r,
                created_at=f"2026-11-20T0{h}:00:00+00:00",
                noise=0.005,
                seed=h,
                iters=60,
                backends=both,
                slowdown=1.2 if r == "c" else 1.0,
            )
            for r, h in (("a", 7), ("b", 8), ("c", 9))
        ],
    )
    con = connect(db)
    try:
        assert tool_timed_backends(con, "c") == ["test-host"]
        flags = drift_flags(con, "c")
        assert flags and {f.backend for f in flags} == {"test-raise"}
        spread = spread_flags(con, "c", noise_target=1e-6)
        assert spread and {f.backend for f in spread} == {"test-raise"}
    finally:
        con.close()
