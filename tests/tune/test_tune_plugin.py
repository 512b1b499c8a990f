"""A plugin backend that declares a tune space (tests/plugins: `test-lib`, its exchanges as knob variants
and a setting line of its own) is tuned through `moelab tune` like a built-in one, with no edit of moelab."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.spec import LaunchSpec
from moelab.core.workload import Workload
from moelab.tune.emit import framework_settings
from moelab.tune.search import Trial
from moelab.tune.space import Candidate, knob_variants, refine, tunable_backends
from moelab.tune.trials import TrialPlan


def test_tune_reads_the_plugins_space_from_its_class(plugin_path: Path, tmp_path: Path) -> None:
    assert tunable_backends()[:4] == ("nccl-a2a", "mxfp8-a2a", "deepep", "hybrid-ep")
    assert "test-lib" in tunable_backends() and "test-raise" in tunable_backends()  # built on nccl-a2a
    lead = Candidate.make("test-lib", "tbo", None)
    assert knob_variants(lead) == [{"exchange": "splits"}, {"exchange": "allgather"}]
    assert refine([lead], (8,), sm_control=False)[1:] == [
        Candidate.make("test-lib", "tbo", None, {"exchange": "splits"}),
        Candidate.make("test-lib", "tbo", None, {"exchange": "allgather"}),
    ]
    plan = TrialPlan(
        workload=Workload(hidden=64, tokens_per_rank=32, topk=2, experts_per_rank=2),
        dtypes={},
        intermediate=16,
        backward=False,
        launch=LaunchSpec(),
        runs_root=tmp_path,
        db_path=tmp_path / "t.duckdb",
        tune_id="abc",
    )
    won = Trial(
        round=3,
        candidate=Candidate.make("test-lib", "serial", 16, {"exchange": "splits"}),
        run_id="r",
        case_id="c",
        status="ok",
        tokens_per_s=1.0,
    )
    assert framework_settings(plan, won) == [
        "test-lib: TestLib(exchange='splits', sms=16)",
        "schedule: serial (no micro-batch overlap)",
    ]


@pytest.mark.slow
def test_a_plugin_is_tuned_over_its_own_knobs(plugin_path: Path, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    result = CliRunner().invoke(
        app,
        [
            "tune",
            "--cpu",
            "--backend",
            "test-lib",
            "--hidden",
            "64",
            "--intermediate",
            "16",
            "--tokens-per-rank",
            "32",
            "--topk",
            "2",
            "--experts-per-rank",
            "2",
            "--iters",
            "3",
            "--db",
            str(db),
            "--out",
            str(tmp_path / "runs"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "test-lib: TestLib(exchange=" in result.stdout and "winner: test-lib" in result.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        second = con.execute(
            "SELECT c.case_id FROM cases c JOIN labels l USING (run_id) WHERE l.label LIKE 'tune-%-r2' AND c.status = 'ok'"
        ).fetchall()
    ids = " ".join(r[0] for r in second)
    assert "exchange=splits" in ids and "exchange=allgather" in ids
