"""Repeats in the store (issue 29, items 1 and 2): each start of a job a process sample of its own, per op
the median of the per-process medians with its bootstrap interval and the CV between processes, each
start's own noise; and a run without repeats stores exactly what it stored before."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.intervals import (
    RESAMPLES,
    interleaved_ratio_interval,
    median_interval,
    process_cv,
    ratio_interval,
    ratio_point,
)
from moelab.core.spec import RunSpec
from moelab.job.rundir import JobFiles, RunDir
from tests.synthetic_runs import BackendModel, RunModel, build_db

TWO = (BackendModel(name="nccl-a2a"), BackendModel(name="mxfp8-a2a", alpha_us=30.0))
COMMON = dict(backends=TWO, tokens=(256,), sms=(None,), iters=20, noise=0.02)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("repeats")
    db = root / "r.duckdb"
    build_db(
        db,
        root / "runs",
        [
            RunModel(run_id="once", seed=1, **COMMON),  # type: ignore[arg-type]
            RunModel(run_id="thrice", seed=2, repeats=3, process_noise=0.03, **COMMON),  # type: ignore[arg-type]
        ],
    )
    return db, root / "runs"


def _q(db: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


# --- the intervals -------------------------------------------------------------------------------------


def test_three_processes_give_their_range_and_the_same_interval_every_time() -> None:
    """Percentile bootstrap of the median of 3: a resample's median is one of the three values, so the
    95% interval is [smallest, largest]; a fixed seed makes it reproducible."""
    ci = median_interval([101.0, 97.0, 104.0])
    assert ci is not None and (ci.low, ci.high) == (97.0, 104.0)
    assert median_interval([101.0, 97.0, 104.0]) == ci
    assert median_interval([100.0]) is None and ratio_interval([1.0], [1.0, 2.0]) is None
    assert median_interval([5.0, 5.0, 5.0]) == type(ci)(5.0, 5.0)
    assert process_cv([100.0, 100.0, 100.0]) == 0.0 and process_cv([1.0]) is None
    assert process_cv([90.0, 100.0, 110.0]) == pytest.approx(0.1)
    assert RESAMPLES == 20_000


def test_a_ratio_interval_covers_one_when_the_processes_overlap() -> None:
    same = ratio_interval([100.0, 103.0, 98.0], [101.0, 97.0, 104.0])
    apart = ratio_interval([100.0, 103.0, 98.0], [111.0, 113.0, 109.0])
    assert same is not None and same.covers(1.0)
    assert apart is not None and not apart.covers(1.0) and apart.low > 1.0
    # paired by start: a drift both backends shared cancels in the per-start ratios
    base, cand = np.array([100.0, 120.0, 90.0]), np.array([95.0, 114.0, 85.5])
    paired = ratio_interval(base, cand, paired=True)
    assert paired is not None and paired.high < 1.0 and ratio_point(base, cand, paired=True) == 0.95
    unpaired = ratio_interval(base, cand)
    assert unpaired is not None and unpaired.covers(1.0)


def test_an_interleaved_ratio_interval_pairs_iterations_and_keeps_the_ratio_of_medians() -> None:
    """A schedule 5% faster than its serial layer, both timed interleaved while the machine slowed 40%:
    paired, the interval excludes 1 and holds the stored metric's point (the ratio of the medians);
    unpaired, the drift swamps it."""
    drift = np.linspace(1.0, 1.4, 8)
    serial = 1000.0 * drift
    layer = 950.0 * drift * np.array([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01])
    ci = interleaved_ratio_interval(layer, serial)
    point = float(np.median(serial) / np.median(layer))
    assert ci is not None and ci.low <= point <= ci.high and ci.low > 1.0 and ci.high < 1.1
    unpaired = ratio_interval(layer, serial)
    assert unpaired is not None and unpaired.covers(1.0)
    assert interleaved_ratio_interval(layer[:1], serial[:1]) is None
    assert interleaved_ratio_interval(layer, serial[:-1]) is None  # not pairs
    assert interleaved_ratio_interval([100.0, 200.0], [110.0, 220.0]) == type(ci)(1.1, 1.1)


def test_an_interval_never_leaves_the_range_of_its_values() -> None:
    """Hypothesis found the bootstrap's interval a rounding step outside the values and outside its point."""
    medians = [1.0, 735029.9976843019]
    ci = median_interval(medians)
    assert ci is not None and ci.low >= 1.0 and ci.high <= max(medians)
    # and once one rounding step above its own point
    medians = [452680.0, 452679.50187157345, 452679.50187157345]
    ci = median_interval(medians)
    assert ci is not None and ci.low <= np.median(medians) <= ci.high
    paired = ratio_interval([1.0, 3.0, 7.0], [735029.9976843019, 2.0, 5.0], paired=True)
    ratios = [735029.9976843019, 2 / 3, 5 / 7]
    assert paired is not None and min(ratios) <= paired.low and paired.high <= max(ratios)


@settings(max_examples=40, deadline=None)
@given(
    medians=st.lists(st.floats(1.0, 1e6, allow_nan=False), min_size=2, max_size=8),
    factor=st.floats(0.5, 2.0),
)
def test_intervals_hold_their_point(medians: list[float], factor: float) -> None:
    ci = median_interval(medians)
    assert ci is not None and min(medians) <= ci.low <= np.median(medians) <= ci.high <= max(medians)
    scaled = ratio_interval(medians, [m * factor for m in medians], paired=True)
    assert scaled is not None and scaled.low == pytest.approx(factor) and scaled.high == pytest.approx(factor)


# --- the store ------------------------------------------------------------------------------------------


def test_each_start_is_stored_as_a_process_sample(store: tuple[Path, Path]) -> None:
    db, runs = store
    rd = RunDir(runs / "thrice")
    assert [f.dir for f in rd.starts("mxfp8-a2a")] == [
        runs / "thrice" / "mxfp8-a2a",
        runs / "thrice" / "mxfp8-a2a" / "r1",
        runs / "thrice" / "mxfp8-a2a" / "r2",
    ]
    assert JobFiles.of_dir(runs / "thrice" / "mxfp8-a2a" / "r2") == JobFiles(runs / "thrice", "mxfp8-a2a", 2)
    positions = _q(
        db,
        "SELECT backend, repeat, position, status FROM processes WHERE run_id = 'thrice' ORDER BY position",
    )
    assert positions == [
        ("nccl-a2a", 0, 0, "ok"),
        ("mxfp8-a2a", 0, 1, "ok"),  # A B
        ("mxfp8-a2a", 1, 2, "ok"),
        ("nccl-a2a", 1, 3, "ok"),  # B A
        ("nccl-a2a", 2, 4, "ok"),
        ("mxfp8-a2a", 2, 5, "ok"),  # A B
    ]
    per_start = _q(
        db,
        "SELECT repeat, count(*) FROM samples WHERE run_id = 'thrice' AND backend = 'nccl-a2a' "
        "AND op = 'dispatch' GROUP BY repeat ORDER BY repeat",
    )
    assert per_start == [(0, 40), (1, 40), (2, 40)]  # 2 ranks x 20 iterations each


def test_per_op_median_of_medians_interval_and_cv(store: tuple[Path, Path]) -> None:
    db, _ = store
    rows = _q(
        db,
        """SELECT r.op, r.median_us, r.ci_low_us, r.ci_high_us, r.process_cv, r.repeats, r.n,
                            list(p.median_us ORDER BY p.repeat), list(p.noise ORDER BY p.repeat)
                     FROM results r JOIN process_results p USING (run_id, backend, case_id, op)
                     WHERE r.run_id = 'thrice' AND r.backend = 'nccl-a2a' GROUP BY ALL""",
    )
    assert {r[0] for r in rows} == {"dispatch", "combine", "roundtrip"}
    for op, median, low, high, cv, repeats, n, medians, noises in rows:
        assert repeats == 3 and n == sum(5 if op == "roundtrip" else 20 for _ in range(3))
        assert median == pytest.approx(np.median(medians))
        assert (low, high) == (pytest.approx(min(medians)), pytest.approx(max(medians)))
        assert cv == pytest.approx(np.std(medians, ddof=1) / np.mean(medians))
        assert len(noises) == 3  # each start's own noise of its median
    (gbps,) = _q(
        db,
        "SELECT gbps FROM bandwidths WHERE run_id = 'thrice' AND backend = 'nccl-a2a' "
        "AND op = 'dispatch' AND definition = 'nvl_recv'",
    )
    (bytes_mean, median) = _q(
        db,
        "SELECT b.bytes_mean, r.median_us FROM bandwidths b JOIN results r "
        "USING (run_id, backend, case_id, op) WHERE run_id = 'thrice' AND backend = 'nccl-a2a' "
        "AND op = 'dispatch' AND definition = 'nvl_recv'",
    )[0]
    assert gbps[0] == pytest.approx(bytes_mean / median / 1e3)  # the bandwidth is over the merged median


def test_a_run_without_repeats_stores_exactly_what_it_did(store: tuple[Path, Path]) -> None:
    """The worker's record as it is: every summary column the record's, new columns at their defaults,
    no per-process rows, one sample block per op, no r<K> folders."""
    db, runs = store
    spec = RunSpec.read(runs / "once" / "spec.json")
    assert spec.launch.repeats == 1
    assert not [p for p in (runs / "once").glob("*/r[0-9]*") if p.is_dir()]
    for backend in ("nccl-a2a", "mxfp8-a2a"):
        (rec,) = JobFiles(runs / "once", backend).scan_results().records
        for op in rec.ops:
            s = op.summary
            stored = _q(
                db,
                "SELECT n, median_us, p10_us, p90_us, p99_us, min_us, max_us, mean_us, rank_spread_us, "
                "rel_iqr, repeats, ci_low_us, ci_high_us, process_cv FROM results WHERE run_id = 'once' "
                "AND backend = ? AND op = ?",
                backend,
                op.op,
            )
            assert stored == [
                (
                    s.n,
                    s.median_us,
                    s.p10_us,
                    s.p90_us,
                    s.p99_us,
                    s.min_us,
                    s.max_us,
                    s.mean_us,
                    s.rank_spread_us,
                    s.rel_iqr,
                    1,
                    None,
                    None,
                    None,
                )
            ]
            samples = _q(
                db,
                "SELECT rank, iter, time_us, repeat FROM samples WHERE run_id = 'once' AND backend = ? "
                "AND op = ? ORDER BY rank, iter",
                backend,
                op.op,
            )
            expected = [(r, i, t, 0) for r, row in enumerate(op.samples_us) for i, t in enumerate(row)]
            assert samples == expected
    for table in ("processes", "process_results", "process_metrics"):
        assert _q(db, f"SELECT count(*) FROM {table} WHERE run_id = 'once'") == [(0,)]


def test_the_intervals_benchmark_reads_a_repeated_run(store: tuple[Path, Path], tmp_path: Path) -> None:
    """benchmarks/repeat_intervals.py, what the GPU run's figures are printed with, on this store."""
    import json
    import subprocess
    import sys

    db, _ = store
    out = tmp_path / "iv.json"
    root = Path(__file__).resolve().parent.parent.parent
    done = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "repeat_intervals.py"),
            "--db",
            str(db),
            "--run",
            "thrice",
            "--reference",
            "nccl-a2a",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["run_id"] == "thrice" and len(data["ops"]) == 2 * 3
    assert all(o["repeats"] == 3 and len(o["start_medians_us"]) == 3 for o in data["ops"])
    assert {p["backend"] for p in data["between_backends"]} == {"mxfp8-a2a"}
    assert all(p["interval"] is not None for p in data["between_backends"])
    assert "95% interval" in done.stdout and "verdict" in done.stdout
