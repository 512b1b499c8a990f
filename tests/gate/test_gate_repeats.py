"""`moelab check` with repeats (issue 29, item 4): the decision on the per-process medians, the rule that
decided named in the output, and today's rule (said so) when a run has no repeats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.gate.decision import Policy, compare_op, compare_processes
from moelab.gate.samples import load_side
from moelab.gate.stats import processes_differ
from moelab.store.db import connect
from tests.synthetic_runs import RunModel, build_db

PROCESS_NOISY = dict(tokens=(256,), sms=(None,), iters=30, noise=0.01, repeats=3, process_noise=0.08)
QUIET = dict(tokens=(256,), sms=(None,), iters=30, noise=0.01, repeats=3, process_noise=0.01)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repeats")
    db = root / "g.duckdb"
    build_db(
        db,
        root / "runs",
        [
            # seeds 105 and 109: no shift, yet the second run's processes came out more than 5% slower
            RunModel(run_id="noisy_a", created_at="2026-11-20T07:00:00+00:00", seed=105, **PROCESS_NOISY),  # type: ignore[arg-type]
            RunModel(run_id="noisy_b", created_at="2026-11-20T08:00:00+00:00", seed=109, **PROCESS_NOISY),  # type: ignore[arg-type]
            RunModel(run_id="base", created_at="2026-11-21T07:00:00+00:00", seed=1, **QUIET),  # type: ignore[arg-type]
            RunModel(run_id="slow", created_at="2026-11-21T08:00:00+00:00", seed=2, slowdown=1.10, **QUIET),  # type: ignore[arg-type]
            RunModel(
                run_id="once",
                created_at="2026-11-21T09:00:00+00:00",
                seed=3,
                tokens=(256,),
                sms=(None,),
                iters=30,
                noise=0.01,
            ),
        ],
    )
    return db


def _check(db: Path, base: str, run: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["check", "--db", str(db), "--baseline", base, "--run", run])
    return r.exit_code, r.output


def test_process_noise_is_not_a_regression_under_the_processes_rule(store: Path) -> None:
    code, out = _check(store, "noisy_a", "noisy_b")
    assert code == 0, out
    assert "rule: processes (3 and 3 starts of each job)" in out and "t-test" in out
    assert "noise" in out and "within the variation between processes" in out
    assert "PASS" in out and "rule: processes)" in out


def test_the_iterations_rule_calls_the_same_runs_a_regression(store: Path) -> None:
    """Why the processes rule exists: on the pooled iterations of the same two runs, Mann-Whitney sees a
    highly significant slowdown, because it takes one process's iterations as independent samples."""
    con = connect(store, read_only=True)
    try:
        a, b = (next(iter(load_side(con, r).cases.values())) for r in ("noisy_a", "noisy_b"))
    finally:
        con.close()
    for op in ("dispatch", "combine", "roundtrip"):
        by_iterations = compare_op("c", op, a.times[op], b.times[op], Policy())
        by_processes = compare_processes("c", op, a.process_medians[op], b.process_medians[op], Policy())
        assert by_iterations.status == "regression" and by_iterations.change > 0.05  # type: ignore[operator]
        assert by_processes.status == "noise" and by_processes.rule == "processes"
        assert by_processes.ratio_low is not None and by_processes.ratio_low < 1 < by_processes.ratio_high  # type: ignore[operator]


def test_t_test_edges() -> None:
    same = np.array([100.0, 100.0, 100.0])
    assert processes_differ(same, same * 1.01).significant is True  # no spread at all: any change counts
    assert processes_differ(same, same).significant is False
    assert processes_differ(same[:1], same).significant is None  # one process: no variance to test with
    a, b = [100.0, 97.0, 102.0], [109.0, 111.0, 106.0]
    apart = processes_differ(a, b)
    expected = stats.ttest_ind(np.log(b), np.log(a), equal_var=True).pvalue  # scipy's own, as a check
    assert apart.significant is True and apart.p_value == pytest.approx(expected, rel=1e-9)


def test_a_ten_percent_slowdown_is_caught_by_the_processes_rule(store: Path) -> None:
    code, out = _check(store, "base", "slow")
    assert code == 1, out
    assert "regression" in out and "t-test" in out and "rule: processes" in out
    assert "+" in out and "%, +" in out  # the interval of the change, e.g. [+8.1%, +12.0%]


def test_without_repeats_on_one_side_the_old_rule_decides_and_says_so(store: Path) -> None:
    code, out = _check(store, "base", "once")
    assert code == 0, out
    assert "rule: iterations, without repeats (the candidate ran each job once" in out
    assert "rule: iterations)" in out


def test_sides_read_per_process_medians(store: Path) -> None:
    con = connect(store, read_only=True)
    try:
        side = load_side(con, "base")
        once = load_side(con, "once")
    finally:
        con.close()
    assert side.repeats == 3 and once.repeats == 1
    (case,) = side.cases.values()
    assert set(case.process_medians) == {"dispatch", "combine", "roundtrip"}
    assert all(m.size == 3 for m in case.process_medians.values())
    assert case.times["dispatch"].size == 3 * 30  # every start's iterations
    assert not next(iter(once.cases.values())).process_medians
