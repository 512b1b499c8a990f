"""Issue 38's one ranking rule (moelab.core.ranking): two runs of the same code at repeat 3 name no winner
in at least 97% of synthetic pairs, and `moelab run`'s summary, `moelab report` and `moelab compare`
give the same verdict on the same stored run."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.cli.run_cmd import print_answer, print_run_summary
from moelab.core import ranking
from tests.synthetic_runs import BackendModel, RunModel, build_db

PAIRS = 1000


@pytest.mark.parametrize("cv", [0.002, 0.02, 0.10])
@pytest.mark.parametrize("paired", [False, True])
def test_same_code_names_no_winner_in_97_percent(cv: float, paired: bool) -> None:
    rng = np.random.default_rng(int(cv * 1000) + paired)
    sigma = np.sqrt(np.log1p(cv**2))
    a = 100.0 * rng.lognormal(0.0, sigma, (PAIRS, 3))
    b = 100.0 * rng.lognormal(0.0, sigma, (PAIRS, 3))
    winners = sum(ranking.rank_pair(x, y, paired).winner for x, y in zip(a, b, strict=True))
    assert winners / PAIRS <= 0.03, f"{winners} of {PAIRS} same-code pairs named a winner"


def test_a_clear_difference_is_ranked_and_one_process_never() -> None:
    a, b = [100.0, 101.0, 99.5], [110.0, 111.0, 109.0]
    assert ranking.rank_pair(a, b).verdict == ranking.SLOWER
    assert ranking.rank_pair(b, a).verdict == ranking.FASTER
    assert ranking.rank_pair(a[:1], [400.0]).verdict == ranking.NO_INTERVAL


SAME_A = BackendModel(name="deepep", alpha_us=8, peak_gbps=600)
SAME_B = BackendModel(name="hybrid-ep", alpha_us=8, peak_gbps=600)  # the same model: no winner
SLOWER = BackendModel(name="nccl-a2a", alpha_us=30, peak_gbps=150)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rule")
    db = root / "r.duckdb"
    build_db(db, root / "runs", [
        RunModel(run_id="rep", backends=(SAME_A, SAME_B, SLOWER), hidden=4096, tokens=(2048,), iters=40,
                 noise=0.01, repeats=3, process_noise=0.005),
    ])  # fmt: skip
    return db


def _compare_verdicts(db: Path) -> dict[tuple[str, str], str]:
    """(op, group) -> verdict against deepep, from `moelab compare --format`-free console output: the
    Ranking objects the command prints, read back through the same table build."""
    from moelab.cli.compare_cmd import _build_table
    from moelab.model.links import PeakTable

    table, _, _ = _build_table(db, ["rep"], "backend", "nvl_recv", "deepep", PeakTable(), 8, 1)
    out = {}
    for row in table.rows:
        for g in table.groups[1:]:
            r = table.ranking(row, g)
            assert r is not None
            out[(row.op, g)] = r.verdict
    return out


def test_run_report_and_compare_agree(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from moelab.cli.common import console as rich_console

    monkeypatch.setattr(rich_console, "width", 1000)
    shown = CliRunner().invoke(app, ["compare", "--db", str(store), "--run", "rep", "--reference", "deepep"])
    assert shown.exit_code == 0, shown.output
    table = shown.output[: shown.output.index("ratios:")]
    assert table.count("indistinguishable") == 3 and table.count("slower") == 3 and "faster" not in table
    compared = _compare_verdicts(store)
    # run's console summary and the report's Markdown summary
    _, view = print_run_summary(store, "rep")
    print_answer(view)
    console = capsys.readouterr().out
    r = CliRunner().invoke(
        app, ["report", "--db", str(store), "--run", "rep", "--format", "md", "-o", str(tmp_path / "r.md")]
    )
    assert r.exit_code == 0, r.output
    md = (tmp_path / "r.md").read_text()
    section = md[md.index("## Summary") : md.index("## Flags")]
    answers = {
        cells[0]: cells[3].strip("*")
        for cells in (
            [c.strip() for c in ln.strip("|").split(" | ")]
            for ln in section.splitlines()
            if ln.startswith("| ") and not ln.startswith("| op ")
        )
    }
    for op in ("dispatch", "combine", "roundtrip"):
        # compare: hybrid-ep against deepep names no winner, nccl-a2a is slower
        assert compared[(op, "hybrid-ep")] == ranking.INDISTINGUISHABLE, compared
        assert compared[(op, "nccl-a2a")] == ranking.SLOWER, compared
        # run and report: the same two that compare cannot tell apart, nccl-a2a beaten
        assert re.fullmatch(r"(deepep, hybrid-ep|hybrid-ep, deepep): indistinguishable", answers[op]), answers
        summary = next(s for s in view.summary_rows if s.op == op)
        verdicts = {e.name: e.verdict for e in summary.entries[1:]}
        assert verdicts["nccl-a2a"] == ranking.SLOWER and ranking.INDISTINGUISHABLE in verdicts.values()
    assert (
        console.count("deepep, hybrid-ep: indistinguishable")
        + console.count("hybrid-ep, deepep: indistinguishable")
        == 3
    )


def test_compare_carries_the_marks(tmp_path: Path) -> None:
    """Issue 38: compare's table carries unstable, suspect and contended like run's and the report's."""
    from moelab.cli.common import console as rich_console

    db = tmp_path / "m.duckdb"
    busy = "host load 8.0 on 2 cores (7.0 beyond this run's 2 ranks)"
    common = dict(backends=(SAME_A,), tokens=(256,), iters=20, noise=0.01)
    build_db(db, tmp_path / "runs", [
        RunModel(run_id="quiet", created_at="2026-11-20T07:00:00+00:00", **common),  # type: ignore[arg-type]
        RunModel(run_id="busy", created_at="2026-11-21T07:00:00+00:00", contended=busy, seed=3, **common),  # type: ignore[arg-type]
    ])  # fmt: skip
    old = rich_console.width
    rich_console.width = 1000
    try:
        r = CliRunner().invoke(
            app, ["compare", "--db", str(db), "--by", "run", "--run", "quiet", "--run", "busy"]
        )
    finally:
        rich_console.width = old
    assert r.exit_code == 0, r.output
    # the busy run's figures carry its marks beside its time; the legend says what they mean
    assert any(" µs !#" in ln for ln in r.output.splitlines()), r.output
    assert "# contended (measured while it ran" in r.output
