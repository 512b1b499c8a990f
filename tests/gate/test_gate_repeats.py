"""`moelab check` with repeats (issue 29, item 4; issue 38): the decision on the per-process medians held to
the op's noise, the rule named in the output, and the same rule when a run has no repeats."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.gate.samples import load_side
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


def test_process_noise_without_history_is_never_passed(store: Path, tmp_path: Path) -> None:
    """Two runs of the same code whose processes vary by 8%: no earlier run to learn the noise from, and
    their own starts show it far wider than the prior, so the gate says it cannot judge (before: PASS)."""
    summary = tmp_path / "s.md"
    r = CliRunner().invoke(
        app, ["check", "--db", str(store), "-B", "noisy_a", "--run", "noisy_b", "--summary", str(summary)]
    )
    assert r.exit_code == 3, r.output
    assert "rule: noise (3 and 3 starts of each job)" in r.output
    assert "PASS" not in r.output and "regression" not in r.output
    md = summary.read_text()
    assert md.count("cannot judge: ") == 3 and "widened by its starts" in md and "use --repeat" in md


def test_a_ten_percent_slowdown_is_caught_with_repeats(store: Path) -> None:
    code, out = _check(store, "base", "slow")
    assert code == 1, out
    assert "regression" in out and "noise-model" in out and "rule: noise" in out
    assert "+" in out and "%, +" in out  # the interval of the change, e.g. [+8.1%, +12.0%]


def test_one_side_without_repeats_is_judged_by_the_same_rule(store: Path) -> None:
    code, out = _check(store, "base", "once")
    assert "rule: noise (3 and 1 starts of each job)" in out
    assert code in (0, 3) and "regression" not in out, out


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
    assert all(m.size == 1 for m in next(iter(once.cases.values())).process_medians.values())
