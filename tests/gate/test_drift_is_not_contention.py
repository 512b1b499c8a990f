"""Issue 38: a regression that ingest's drift judgment noticed (a median more than 5% from the previous
run's, which marks the slower run's case suspect) gets a regression verdict, never CONTENDED: the gate takes
contention only from what was measured while the case ran (host load, other runs, health). The three cases
the issue found on CPU with stored runs, each through `moelab check` on a store built by the real ingest."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.store.db import connect
from moelab.store.ingest import ingest
from moelab.store.judgments import judge
from tests.gate.history_runs import history
from tests.synthetic_runs import RunModel, write_run

QUIET = dict(tokens=(256,), sms=(None,), iters=40, noise=0.005)
BUSY = "host load 8.0 on 2 cores (7.0 beyond this run's 2 ranks)"
CASES = {
    # a clean synthetic +10% regression, one process a side
    "plain": ("base", "slow10", {"slowdown": 1.10}),
    # +10% with --repeat 3 on both sides
    "repeats": ("base3", "slow10r3", {"slowdown": 1.10, "repeats": 3, "process_noise": 0.002}),
    # a single-process candidate 48.5% slower
    "single": ("base", "slow48", {"slowdown": 1.485}),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("drift")
    db = root / "g.duckdb"
    runs = history(6, **QUIET) + [
        RunModel(run_id="base", created_at="2026-11-20T07:00:00+00:00", seed=1, **QUIET),  # type: ignore[arg-type]
        RunModel(
            run_id="base3",
            created_at="2026-11-20T08:00:00+00:00",
            seed=2,
            repeats=3,
            process_noise=0.002,
            **QUIET,
        ),  # type: ignore[arg-type]
    ]
    for i, (_base, name, extra) in enumerate(CASES.values()):
        # a run at the old level just before each candidate: the one drift holds the candidate against
        runs.append(
            RunModel(run_id=f"ref{i}", created_at=f"2026-11-2{1 + i}T06:00:00+00:00", seed=30 + i, **QUIET)
        )  # type: ignore[arg-type]
        runs.append(
            RunModel(
                run_id=name, created_at=f"2026-11-2{1 + i}T07:00:00+00:00", seed=10 + i, **QUIET, **extra
            )
        )  # type: ignore[arg-type]
    runs.append(
        RunModel(
            run_id="busy_slow",
            created_at="2026-11-25T07:00:00+00:00",
            seed=20,
            contended=BUSY,
            slowdown=1.10,
            **QUIET,
        )
    )  # type: ignore[arg-type]
    con = connect(db)
    try:
        for m in runs:  # as `moelab ingest` does: store, then judge against the history (drift, spread)
            judge(con, ingest(con, write_run(root / "runs", m)))
    finally:
        con.close()
    return db


@pytest.mark.parametrize("which", list(CASES))
def test_a_regression_drift_noticed_is_a_regression(store: Path, which: str) -> None:
    base, cand, _ = CASES[which]
    con = duckdb.connect(str(store), read_only=True)
    try:
        marked = con.execute(
            "SELECT bool_or(suspect), string_agg(suspect_reason, '; ') FROM cases_judged WHERE run_id = ?",
            [cand],
        ).fetchone()
    finally:
        con.close()
    assert marked is not None and marked[0] and "drift" in marked[1]  # ingest's drift judgment noticed it
    r = CliRunner().invoke(app, ["check", "--db", str(store), "--baseline", base, "--run", cand])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.output and "CONTENDED" not in r.output and "contended" not in r.output
    assert r.output.count("regression") >= 2


def test_measured_contention_is_still_contended(store: Path) -> None:
    r = CliRunner().invoke(app, ["check", "--db", str(store), "--baseline", "base", "--run", "busy_slow"])
    assert r.exit_code == 4, r.output
    assert "CONTENDED" in r.output and "host-load" in r.output
