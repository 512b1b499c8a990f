"""The summary that leads the report and ends the console: backends ranked with the intervals that make
the ranking honest, on synthetic runs whose answer is known."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.cli.run_cmd import print_answer, print_run_summary
from moelab.core import ranking
from moelab.reports.summary import Estimate, interval, rank
from tests.synthetic_runs import BackendModel, RunModel, build_db

# deepep and its twin are the same model (only their noise draws differ); nccl-a2a is four times slower
FAST = BackendModel(name="deepep", alpha_us=8, peak_gbps=600)
TWIN = BackendModel(name="hybrid-ep", alpha_us=8, peak_gbps=600)
SLOW = BackendModel(name="nccl-a2a", alpha_us=30, peak_gbps=150)


def _report(db: Path, out: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["report", "--db", str(db), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return out.read_text()


def _summary_rows(md: str) -> dict[str, list[str]]:
    """op -> cells of the summary table of a one-workload Markdown report."""
    section = md[md.index("## Summary") : md.index("## Flags")]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| op ")]
    return {cells[0]: cells for cells in ([c.strip() for c in ln.strip("|").split(" | ")] for ln in rows)}


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two")
    build_db(root / "two.duckdb", root / "runs", [
        RunModel(run_id="two", backends=(SLOW, FAST), hidden=4096, tokens=(2048,), iters=40, noise=0.01,
                 repeats=3, process_noise=0.005),
        RunModel(run_id="once", created_at="2026-11-23T07:00:00+00:00", backends=(SLOW, FAST), hidden=4096,
                 tokens=(2048,), iters=40, noise=0.01),
    ])  # fmt: skip
    return root / "two.duckdb"


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("three")
    build_db(root / "three.duckdb", root / "runs", [
        RunModel(run_id="three", backends=(SLOW, FAST, TWIN), hidden=4096, tokens=(2048,), iters=40, noise=0.01,
                 repeats=3, process_noise=0.005),
    ])  # fmt: skip
    return root / "three.duckdb"


def test_summary_names_the_fastest_backend(two: Path, tmp_path: Path) -> None:
    md = _report(two, tmp_path / "r.md", "--format", "md", "--run", "two")
    rows = _summary_rows(md)
    assert set(rows) == {"dispatch", "combine", "roundtrip"}
    for op, cells in rows.items():
        assert cells[3] == "**deepep fastest**", (op, cells)  # 3 processes a side: an interval over them
        first, second = cells[4].split("<br>")
        assert first.startswith("1. **deepep**") and second.startswith("2. **nccl-a2a**")
        assert "≈" not in second  # four times apart: distinguishable
        assert "±" in first
    html = _report(two, tmp_path / "r.html", "--run", "two")
    assert html.index('id="summary"') < html.index('id="flags"') < html.index('id="results"')
    assert html.count("<b>deepep fastest</b>") == 3


def test_without_an_interval_there_is_no_winner(two: Path, tmp_path: Path) -> None:
    """Issue 38: one process a side has no interval over processes, and "(no interval)" is never a winner,
    however far apart the medians are (here four times)."""
    rows = _summary_rows(_report(two, tmp_path / "r.md", "--format", "md", "--run", "once"))
    for op, cells in rows.items():
        assert cells[3] == "**deepep, nccl-a2a: no interval to rank them (--repeat 3)**", (op, cells)
        assert "fastest" not in cells[3]


def test_summary_says_indistinguishable_where_the_intervals_overlap(three: Path, tmp_path: Path) -> None:
    rows = _summary_rows(_report(three, tmp_path / "r.md", "--format", "md"))
    for op, cells in rows.items():
        assert re.fullmatch(r"\*\*(deepep, hybrid-ep|hybrid-ep, deepep): indistinguishable\*\*", cells[3]), (
            op,
            cells,
        )
        ranking = cells[4].split("<br>")
        assert ranking[1].startswith("2. ≈ ") and ranking[2].startswith("3. **nccl-a2a**")


def test_console_ends_with_the_same_answer(three: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, view = print_run_summary(three, "three")
    print_answer(view)
    out = capsys.readouterr().out
    summary = out[out.index("summary: median ±95% interval") :]
    assert summary.count("deepep, hybrid-ep: indistinguishable") == 3 and "≈ hybrid-ep" in summary
    # a synthetic GPU run with no earlier run on its machine: its drift was not judged, and it says why
    assert "drift between runs not judged: no earlier run of these cases" in out


def test_interval_is_the_stored_noise() -> None:
    est = interval({"median_us": 100.0, "noise": 0.02})
    assert est is not None and (est.low_us, est.high_us, est.known) == (98.0, 102.0, True)
    assert est.half_width == pytest.approx(0.02)
    point = interval({"median_us": 100.0, "noise": None})
    assert point is not None and not point.known and point.low_us == point.high_us == 100.0
    assert interval({"median_us": None}) is None


def test_rank_marks_ties_with_the_fastest() -> None:
    est = {
        "slow": Estimate(median_us=200, low_us=198, high_us=202),
        "a": Estimate(median_us=100, low_us=98, high_us=102),
        "b": Estimate(median_us=101, low_us=99, high_us=103),
        "once": Estimate(median_us=300, low_us=300, high_us=300, known=False),
    }
    procs = {"slow": ([199.0, 200.0, 201.0], "r"), "a": ([99.0, 100.0, 101.0], "r"),
             "b": ([100.0, 101.0, 102.0], "r"), "once": ([300.0], "r")}  # fmt: skip
    ranked = rank(est, procs)
    assert [(r.name, r.tie, r.verdict) for r in ranked] == [
        ("a", False, ""),
        ("b", True, "indistinguishable"),
        ("slow", False, "slower"),
        ("once", True, "no interval"),  # 3x slower, yet one process: not beaten by the rule
    ]


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=4), st.tuples(st.floats(1, 1e6), st.floats(0.001, 0.5)), min_size=1
    )
)
def test_rank_is_fastest_first_and_ties_are_not_winners(given_: dict[str, tuple[float, float]]) -> None:
    estimates = {n: Estimate(median_us=m, low_us=m, high_us=m) for n, (m, _w) in given_.items()}
    procs = {n: ([m * (1 - w), m, m * (1 + w)], "r") for n, (m, w) in given_.items()}
    ranked = rank(estimates, procs)
    medians = [r.estimate.median_us for r in ranked]
    assert medians == sorted(medians) and len(ranked) == len(estimates) and not ranked[0].tie
    first = procs[ranked[0].name][0]
    for r in ranked[1:]:
        assert r.tie == (ranking.rank_pair(first, procs[r.name][0]).verdict not in ranking.WINNERS)


def test_baseline_verdicts_in_the_summary(tmp_path: Path) -> None:
    db = tmp_path / "b.duckdb"
    common = dict(backends=(FAST,), hidden=4096, tokens=(2048,), iters=40, noise=0.01)
    build_db(db, tmp_path / "runs", [
        RunModel(run_id="base", created_at="2026-11-20T07:00:00+00:00", label="main", **common),  # type: ignore[arg-type]
        RunModel(run_id="slower", created_at="2026-11-21T07:00:00+00:00", slowdown=1.3, seed=1, **common),  # type: ignore[arg-type]
    ])  # fmt: skip
    md = _report(db, tmp_path / "r.md", "--format", "md", "--baseline", "main", "--run", "slower")
    rows = _summary_rows(md)
    assert "| vs baseline |" in md, md
    # roundtrip (host-sync) without history: its prior is too wide to judge at repeat 1, and it says so
    assert {op: cells[7] for op, cells in rows.items()} == {
        "dispatch": "1 regression",
        "combine": "1 regression",
        "roundtrip": "1 underpowered",
    }
    assert "Verdicts against" in md and "run `slower`" in md
    bad = CliRunner().invoke(
        app, ["report", "--db", str(db), "--baseline", "main", "--run", "base", "--run", "slower"]
    )
    assert bad.exit_code == 2 and "error: --baseline holds one run against it" in bad.output
