"""A repeated run (--repeat N) stopped in its last start keeps the starts that finished (issue 34, fix 2):
its cases are measured over them, its `processes` rows name the start that is missing, and `report` and
`compare` say that the run is partial and which starts it lacks. The run directories are written as the
runner leaves them after SIGTERM (the real stop on gloo ranks: tests/launch/test_repeat_interrupt.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.job.rundir import JobFiles, RunDir
from tests.hostile.world import Outcome, rows_of
from tests.synthetic_runs import BackendModel, RunModel, write_run

TWO = (BackendModel(name="nccl-a2a"), BackendModel(name="mxfp8-a2a", alpha_us=30.0))
STARTS = 3
TOKENS = (256, 512)


def moelab(*argv: str) -> Outcome:
    """The command as typed (in this process: each subprocess would import torch again)."""
    result = CliRunner().invoke(app, list(argv))
    return Outcome(result.exit_code, result.stdout, result.stderr)


def stop_in_last_start(run_dir: Path, backend: str, kept_cases: int, began: bool = True) -> None:
    """As the runner leaves a start that SIGTERM cut short: the cases it finished before the signal, its
    job.json marked interrupted (note_interrupted_job); or, not `began`, nothing of it at all."""
    files = JobFiles(run_dir, backend, STARTS - 1)
    if not began:
        for path in sorted(files.dir.iterdir()):
            path.unlink()
        files.dir.rmdir()
        return
    lines = files.results.read_text().splitlines(keepends=True)
    files.results.write_text("".join(lines[:kept_cases]))
    job = files.read_job()
    assert job is not None
    job.update(
        returncode=-15,
        signal="SIGTERM",
        interrupted="SIGTERM",
        description="interrupted by SIGTERM (moelab run stopped); backend job stopped",
    )
    files.write_job(job)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("partial")
    run_dir = write_run(
        root / "runs", RunModel(run_id="stopped", backends=TWO, tokens=TOKENS, repeats=STARTS, iters=8)
    )
    stop_in_last_start(run_dir, "nccl-a2a", kept_cases=1)  # the start running when the signal came
    stop_in_last_start(run_dir, "mxfp8-a2a", kept_cases=0, began=False)  # the start that never began
    RunDir(run_dir).set_status("interrupted", signal="SIGTERM")
    db = root / "m.duckdb"
    stored = moelab("ingest", str(run_dir), "--db", str(db))
    assert stored.code == 0, stored.stderr
    return db, root


def test_the_finished_starts_are_stored(stopped: tuple[Path, Path]) -> None:
    db, _ = stopped
    assert rows_of(db, "SELECT status FROM runs") == [("interrupted",)]
    statuses = rows_of(db, "SELECT backend, status, count(*) FROM cases GROUP BY ALL ORDER BY ALL")
    assert statuses == [("mxfp8-a2a", "ok", len(TOKENS)), ("nccl-a2a", "ok", len(TOKENS))]
    repeats = rows_of(
        db, "SELECT backend, case_id, min(repeats), max(repeats) FROM results GROUP BY ALL ORDER BY ALL"
    )
    assert len(repeats) == 2 * len(TOKENS)
    # nccl-a2a's first case finished in the stopped start too: over 3 starts; every other case over 2
    assert sorted(r[2] for r in repeats) == [2, 2, 2, 3] and all(r[2] == r[3] for r in repeats)
    samples = rows_of(
        db, "SELECT backend, list(DISTINCT repeat ORDER BY repeat) FROM samples GROUP BY ALL ORDER BY 1"
    )
    assert samples == [("mxfp8-a2a", [0, 1]), ("nccl-a2a", [0, 1, 2])]
    missing = rows_of(db, "SELECT backend, repeat, status FROM processes WHERE status <> 'ok' ORDER BY ALL")
    assert missing == [("mxfp8-a2a", 2, "not-run"), ("nccl-a2a", 2, "interrupted")]


PARTIAL = (
    "run stopped is partial: missing mxfp8-a2a start 3 of 3 (did not run), nccl-a2a start 3 of 3 "
    "(interrupted by SIGTERM (moelab run stopped)); its figures are over the starts that finished"
)


def test_report_and_compare_say_which_starts_are_missing(stopped: tuple[Path, Path]) -> None:
    db, root = stopped
    md = root / "r.md"
    report = moelab("report", "--run", "stopped", "--format", "md", "-o", str(md), "--db", str(db))
    assert report.code == 0, report.stderr
    assert PARTIAL in md.read_text()
    page = root / "c.html"
    compare = moelab("compare", "--run", "stopped", "--html", str(page), "--db", str(db))
    assert compare.code == 0, compare.stderr
    assert PARTIAL in " ".join(compare.stdout.split())
    assert PARTIAL in page.read_text()


def test_a_complete_repeated_run_says_nothing_of_missing_starts(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", RunModel(run_id="whole", backends=TWO, repeats=2, iters=8))
    db = tmp_path / "m.duckdb"
    assert moelab("ingest", str(run_dir), "--db", str(db)).code == 0
    compare = moelab("compare", "--run", "whole", "--db", str(db))
    assert compare.code == 0 and "partial" not in compare.stdout, compare.stderr
