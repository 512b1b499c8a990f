"""`moelab report --history`: series over many runs, steps found where they were put, labels and
environment changes marked, filters, and a file whose size follows the series, not the runs."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import pytest
import typer
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from moelab.cli.report_cmd import report
from moelab.core.steps import detect_steps
from moelab.reports import svg_chart
from moelab.reports.history import parse_since
from tests.synthetic_history import HistoryModel, build

STEPS = {("deepep", "dispatch"): [(120, 1.10)], ("nccl-a2a", "combine"): [(60, 0.92), (150, 1.05)]}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("history") / "history.duckdb"
    con = duckdb.connect(str(path))
    build(con, HistoryModel(runs=200, samples_per_run=0, steps=STEPS, label_every=50, noise=0.008))
    con.close()
    return path


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("report")(report)
    app.command("noop")(lambda: None)
    return app


def _run(args: list[str]) -> str:
    r = CliRunner().invoke(_app(), ["report", *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_history_finds_the_steps_that_were_put_there(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "h.html"
    _run(["--history", "--db", str(db), "-o", str(out)])
    html = out.read_text()
    assert html.count("<svg") == 12  # 2 backends x 2 SM settings x 3 ops
    assert "<script" not in html and "default-src 'none'" in html
    steps_table = html[html.index('id="steps"') : html.index('id="series"')]
    rows = re.findall(
        r"<tr><td class=\"l\"><a href=\"#series-\d+\">([^<]+)</a></td><td class=\"l\">[^<]*</td><td class=\"l\">(r\d+)</td><td class=\"l\">(r\d+)</td>.*?([+-]\d+\.\d)%",
        steps_table,
    )
    found = {
        (title.split(" ")[0], title.split(" · ")[1], after, round(float(change)))
        for title, _b, after, change in rows
    }
    assert found == {
        ("deepep", "dispatch", "r000120", 10),
        ("nccl-a2a", "combine", "r000060", -8),
        ("nccl-a2a", "combine", "r000150", 5),
    }
    assert len(rows) == 2 * 3  # each of those steps in both SM settings
    assert "release-1" in html and "driver 580.65.06 → 590.10.01" in html and "nccl 2.28.9 → 2.29.1" in html


def test_filters(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "f.html"
    _run(["--backend", "deepep", "--db", str(db), "-o", str(out)])
    assert out.read_text().count("<svg") == 6
    _run(["--since", "2026-01-05", "--gpu", "h200", "--db", str(db), "-o", str(out)])
    html = out.read_text()
    assert "104 runs" in html  # hourly runs from 2026-01-01 00:00: from index 96 on
    _run(["--label", "release-2", "--db", str(db), "-o", str(out)])
    assert "1 runs" in out.read_text()
    r = CliRunner().invoke(_app(), ["report", "--gpu", "H100", "--db", str(db), "-o", str(out)])
    assert r.exit_code == 2 and r.output.startswith("error: no measured case matches (gpu H100)")
    r = CliRunner().invoke(_app(), ["report", "--since", "last tuesday", "--db", str(db), "-o", str(out)])
    assert r.exit_code == 2 and "--since takes a date" in r.output


@pytest.mark.parametrize("since", ["99999999d", "9999999999999999999999w", "0001-01-01T00:00+14:00"])
def test_a_since_outside_the_calendar_is_one_error(db: Path, tmp_path: Path, since: str) -> None:
    out = tmp_path / "h.html"
    r = CliRunner().invoke(_app(), ["report", "--since", since, "--db", str(db), "-o", str(out)])
    assert (
        r.exit_code == 2
        and r.output == f"error: --since {since!r} is outside the calendar (years 1 to 9999)\n"
    )
    assert not out.exists()


def test_markdown_history(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "h.md"
    _run(["--history", "--format", "md", "--db", str(db), "-o", str(out)])
    text = out.read_text()
    assert "**Detected steps**" in text and "`r000120`" in text and "<svg" not in text


def test_chart_size_follows_the_width_not_the_runs(tmp_path: Path) -> None:
    sizes = []
    for runs in (500, 5_000):
        path = tmp_path / f"h{runs}.duckdb"
        con = duckdb.connect(str(path))
        build(
            con,
            HistoryModel(
                runs=runs, samples_per_run=0, backends=("nccl-a2a",), sms=(None,), ops=("dispatch",)
            ),
        )
        con.close()
        out = tmp_path / f"h{runs}.html"
        _run(["--history", "--db", str(path), "-o", str(out)])
        html = out.read_text()
        for points in re.findall(r'<polyline points="([^"]+)"', html):
            assert len(points.split()) <= svg_chart.MAX_POINTS
        sizes.append(len(html))
    assert sizes[1] < 1.2 * sizes[0]


def test_parse_since() -> None:
    now = datetime(2026, 11, 22, 12, 0)
    assert parse_since("30d", now) == datetime(2026, 10, 23, 12, 0)
    assert parse_since("12h", now) == datetime(2026, 11, 22, 0, 0)
    assert parse_since("2026-11-01", now) == datetime(2026, 11, 1)
    assert parse_since("2026-11-01T12:00+02:00", now) == datetime(2026, 11, 1, 10, 0)
    assert parse_since(None, now) is None


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(20, 3000),
    at=st.floats(0.2, 0.8),
    factor=st.sampled_from([0.85, 0.9, 1.06, 1.1, 1.3]),
    spread=st.floats(0.001, 0.01),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_clear_step_is_found_where_it_is(
    n: int, at: float, factor: float, spread: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    y = 100.0 * rng.lognormal(0.0, spread, n)
    k = int(n * at)
    y[k:] *= factor
    (step,) = detect_steps(y)
    assert abs(step.index - k) <= 1
    assert step.change == pytest.approx(factor - 1, abs=4 * spread)  # segment medians, as few as 4 points


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 3000), spread=st.floats(0.0, 0.005), seed=st.integers(0, 2**32 - 1))
def test_noise_alone_has_no_step(n: int, spread: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    assert detect_steps(100.0 * rng.lognormal(0.0, spread, n)) == []


def test_steps_refuse_non_positive_values() -> None:
    with pytest.raises(ValueError):
        detect_steps([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])


def test_many_runs_get_the_history_view_unless_asked_otherwise(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "auto.html"
    runs = [a for i in range(25) for a in ("--run", f"r{i:06d}")]
    stdout = _run([*runs, "--db", str(db), "-o", str(out)])
    assert "25 runs: drawing their history" in stdout and "moelab history" in out.read_text()
    r = CliRunner().invoke(
        _app(), ["report", "--no-history", "--gpu", "H200", "--db", str(db), "-o", str(out)]
    )
    assert r.exit_code == 2 and "drop --no-history" in r.output


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(30, 3000),
    burst=st.integers(1, 3),
    every=st.integers(10, 200),
    seed=st.integers(0, 2**32 - 1),
)
@example(n=1151, burst=2, every=85, seed=85)  # a burst in the last segment of 4 read as a step (CI)
def test_bursts_of_slow_runs_are_not_steps(n: int, burst: int, every: int, seed: int) -> None:
    """Up to 3 slow runs in a row (x1.5), then back: a noisy neighbour, not a new level."""
    rng = np.random.default_rng(seed)
    y = 100.0 * rng.lognormal(0.0, 0.005, n)
    for start in range(every // 2, n - burst, every):
        y[start : start + burst] *= 1.5
    assert detect_steps(y) == []
