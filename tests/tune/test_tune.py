"""`moelab tune`: the search space, successive halving against a scripted objective, the emitted suite and
settings, presets and flag errors, and one real CPU (gloo) tune through the CLI whose trials are stored."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.cli.tune_cmd import round_timings
from moelab.core.errors import MoelabError, SpecError
from moelab.core.models import MODELS, model_shape
from moelab.core.spec import LaunchSpec, TimingSpec
from moelab.core.workload import Workload
from moelab.plan.planning import HostFacts, RunRequest
from moelab.reports.html import write_report
from moelab.suites.loader import expand, load_suite
from moelab.tune.emit import framework_settings, suite_toml, summary_lines
from moelab.tune.search import ROUNDS, Trial, TuneConfig, TuneResult, full_product, tune
from moelab.tune.space import Candidate, coarse, default_candidate, knob_variants, refine, sm_neighbours
from moelab.tune.trials import TrialPlan, plan_trials

BACKENDS = ("nccl-a2a", "deepep", "hybrid-ep")
TIMINGS = (TimingSpec(iters=1), TimingSpec(iters=2), TimingSpec(iters=3))


def test_coarse_grid_and_neighbours() -> None:
    c = coarse(["deepep"], (8, 16, 32), sm_control=True)
    assert len(c) == 2 * 4 and Candidate.make("deepep", "tbo", None) in c
    assert coarse(["nccl-a2a"], (8, 16), sm_control=False) == [
        Candidate.make("nccl-a2a", "serial", None),
        Candidate.make("nccl-a2a", "tbo", None),
    ]
    assert sm_neighbours(16, (8, 16, 32, 64)) == [12, 24]
    assert sm_neighbours(8, (8, 16)) == [12] and sm_neighbours(None, (8, 16)) == []
    assert all(s % 2 == 0 for s in sm_neighbours(10, (8, 16, 32)))  # DeepEP: even SM counts only


def test_refine_adds_neighbours_and_knob_variants_once() -> None:
    s = Candidate.make("deepep", "tbo", 16)
    out = refine([s, s], (8, 16, 32), sm_control=True)
    assert out[0] == s and len(out) == len(set(out))
    assert {c.sms for c in out} == {12, 16, 24}
    assert {c.knobs for c in out if c.sms == 16} >= {(("nvl_chunk", 12),), (("combine_nvl_chunk", 16),)}
    assert refine([Candidate.make("nccl-a2a", "tbo", None)], (8,), sm_control=False) == [
        Candidate.make("nccl-a2a", "tbo", None)
    ]
    assert knob_variants(Candidate.make("hybrid-ep", "tbo", 16)) == [{"combine_sms": 8}, {"combine_sms": 24}]


def _score(c: Candidate) -> float:
    """A scripted objective: deepep best, at 24 SMs, under tbo, with nvl_chunk 32; hybrid-ep close behind."""
    base = {"deepep": 100.0, "hybrid-ep": 95.0, "nccl-a2a": 60.0}[c.backend]
    sms = 20 if c.sms is None else c.sms
    s = base - abs(sms - 24) * 0.5 + (10 if c.mode == "tbo" else 0)
    return s + (3 if dict(c.knobs).get("nvl_chunk") == 32 else 0)


class Scripted:
    def __init__(self, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.rounds: list[tuple[int, list[Candidate], TimingSpec]] = []
        self.fail = fail

    def __call__(self, n: int, cands: Sequence[Candidate], timing: TimingSpec) -> list[Trial]:
        self.rounds.append((n, list(cands), timing))
        return [
            Trial(round=n, candidate=c, run_id=f"run{n}", case_id=c.describe(),
                  status="failed" if c.backend in self.fail else "ok",
                  tokens_per_s=None if c.backend in self.fail else _score(c), reason="boom" if c.backend in self.fail else None)
            for c in cands
        ]  # fmt: skip


def test_successive_halving_finds_the_best_with_a_bounded_cost() -> None:
    config = TuneConfig(backends=BACKENDS, sms_grid=(8, 16, 32, 64), sm_control=True, timings=TIMINGS)
    runner = Scripted()
    result = tune(config, runner)
    assert result.winner.candidate == Candidate.make("deepep", "tbo", 24, {"nvl_chunk": 32})
    assert result.winner.round == 3 and [r[0] for r in runner.rounds] == [1, 2, 3]
    assert [r[2].iters for r in runner.rounds] == [1, 2, 3]  # more iterations as candidates get fewer
    assert len(result.trials) < result.full_product == full_product(config)
    assert result.default is not None and result.default.candidate == default_candidate("deepep")
    assert result.runner_up is not None and result.runner_up.candidate != result.winner.candidate
    final = runner.rounds[2][1]
    # the two best of round 2 (one varied the SMs, one the knobs), the two joined, the default
    assert len(final) == 4 and default_candidate("deepep") in final
    margin = result.margin(result.winner, result.default)
    assert margin == pytest.approx(_score(result.winner.candidate) / _score(default_candidate("deepep")) - 1)
    assert len(result.run_ids) == 3


def test_failed_backends_drop_out_and_all_failing_is_an_error() -> None:
    config = TuneConfig(backends=BACKENDS, sms_grid=(16, 32), sm_control=True, timings=TIMINGS)
    result = tune(config, Scripted(fail={"deepep"}))
    assert result.winner.candidate.backend == "hybrid-ep"
    assert any(t.status == "failed" for t in result.trials)
    with pytest.raises(MoelabError, match="no trial of round 1"):
        tune(config, Scripted(fail=set(BACKENDS)))


def _plan(tmp_path: Path, backward: bool = False) -> TrialPlan:
    return TrialPlan(
        workload=Workload(hidden=256, tokens_per_rank=64, topk=4, experts_per_rank=4), dtypes={"deepep": "fp8"},
        intermediate=64, backward=backward, launch=LaunchSpec(nproc_per_node=2, gpus_per_node=2),
        runs_root=tmp_path, db_path=tmp_path / "db.duckdb", tune_id="abc123",
    )  # fmt: skip


def _trial(c: Candidate, value: float = 1000.0) -> Trial:
    return Trial(round=3, candidate=c, run_id="r", case_id="x", status="ok", tokens_per_s=value)


@pytest.mark.parametrize(
    "cand",
    [
        Candidate.make("deepep", "tbo", 24, {"nvl_chunk": 32}),
        Candidate.make("hybrid-ep", "serial", None),
        Candidate.make("nccl-a2a", "tbo", 16),
    ],
    ids=lambda c: c.describe(),
)
def test_the_winners_suite_reruns_exactly_the_winning_case(tmp_path: Path, cand: Candidate) -> None:
    plan = _plan(tmp_path)
    path = tmp_path / "w.toml"
    path.write_text(suite_toml(plan, _trial(cand)))
    cases = expand(load_suite(str(path)), [cand.backend], world=2)
    want = plan.spec_for(ROUNDS, [cand], TimingSpec(iters=1)).cases[0]
    assert [(c.case_id, c.sms, c.knobs, c.workload) for c in cases] == [
        (want.case_id, want.sms, want.knobs, want.workload)
    ]
    assert cases[0].kind == "e2e" and cases[0].e2e == want.e2e
    cases[0].e2e.resolve(cases[0].workload)


def test_framework_settings_name_each_librarys_knobs(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    deepep = "\n".join(
        framework_settings(plan, _trial(Candidate.make("deepep", "tbo", 24, {"nvl_chunk": 32})))
    )
    assert "Buffer.set_num_sms(24)" in deepep and "deep_ep.Config(24, 32" in deepep
    assert "--moe-deepep-num-sms 24" in deepep and "two-batch overlap" in deepep
    assert "_set_sm_carveout_experimental(24)" in deepep  # the GEMMs leave the communication its SMs
    hybrid = "\n".join(
        framework_settings(plan, _trial(Candidate.make("hybrid-ep", "serial", 16, {"combine_sms": 8})))
    )
    assert (
        "num_sms_dispatch_api=16, num_sms_combine_api=8" in hybrid and "--moe-hybridep-num-sms 16" in hybrid
    )
    nccl = "\n".join(framework_settings(plan, _trial(Candidate.make("nccl-a2a", "tbo", 16))))
    assert "min_ctas = max_ctas = 16" in nccl
    default = "\n".join(framework_settings(plan, _trial(Candidate.make("deepep", "serial", None))))
    assert "set_num_sms(20)" in default and "serial" in default and "carveout" not in default


def test_summary_states_margins(tmp_path: Path) -> None:
    w, r, d = (
        _trial(Candidate.make("deepep", m, s), v)
        for m, s, v in (("tbo", 24, 1200.0), ("tbo", 16, 1000.0), ("serial", None, 800.0))
    )
    result = TuneResult(trials=(w, r, d), winner=w, runner_up=r, default=d, full_product=40, run_ids=("r",))
    text = "\n".join(summary_lines(_plan(tmp_path), result))
    assert "+20.0%" in text and "+50.0%" in text and "3 trials" in text and "40" in text


def test_margins_over_repeated_starts_have_their_interval(tmp_path: Path) -> None:
    """With --repeat the final round's verdict knows its noise: the margin's interval over the starts,
    paired by start (one run), and 'indistinguishable' where it covers no difference."""

    def trial(mode: str, sms: int | None, starts: tuple[float, ...]) -> Trial:
        return Trial(
            round=3,
            candidate=Candidate.make("deepep", mode, sms),
            run_id="r",
            case_id="x",
            status="ok",
            tokens_per_s=sorted(starts)[1],
            per_start=starts,
        )

    w, r, d = (
        trial("tbo", 24, (1200.0, 1180.0, 1230.0)),
        trial("tbo", 16, (1190.0, 1200.0, 1160.0)),
        trial("serial", None, (800.0, 790.0, 810.0)),
    )
    result = TuneResult(trials=(w, r, d), winner=w, runner_up=r, default=d, full_product=40, run_ids=("r",))
    low, high = result.margin_interval(w, r)  # type: ignore[misc]
    assert low < 0 < high
    text = "\n".join(summary_lines(_plan(tmp_path), result))
    assert "over 3 starts: indistinguishable" in text and "over 3 starts: ahead" in text
    once = TuneResult(
        trials=(_trial(w.candidate), _trial(r.candidate)),
        winner=_trial(w.candidate),
        runner_up=_trial(r.candidate),
        default=None,
        full_product=4,
    )
    assert "no interval; --repeat 3 for one" in "\n".join(summary_lines(_plan(tmp_path), once))


def test_only_the_final_round_repeats(tmp_path: Path) -> None:
    timings = round_timings("cpu", 3, None)
    cands = [Candidate.make("nccl-a2a", "serial", None)]
    plan = plan_trials(
        request=RunRequest(backends=("nccl-a2a",), cpu=True, repeat=3),
        host=HostFacts(),
        workload=Workload(hidden=256, tokens_per_rank=64, topk=4, experts_per_rank=4),
        dtypes={},
        intermediate=64,
        backward=False,
        first=cands,
        final=timings[2],
        runs_root=tmp_path,
        db_path=tmp_path / "db.duckdb",
        tune_id="abc123",
    )
    assert [plan.spec_for(n, cands, timings[n - 1]).launch.repeats for n in (1, 2, 3)] == [1, 1, 3]


def test_presets_are_the_model_table() -> None:
    assert model_shape("deepseek-v3").experts_per_rank(8) == 32 and MODELS["deepseek-v3"].hidden == 7168
    assert model_shape("mixtral-8x7b").topk == 2 and model_shape("qwen3-moe") is MODELS["qwen3-235b-a22b"]
    with pytest.raises(SpecError, match="--preset mixtral-8x7b: 8 experts do not split evenly over 3 ranks"):
        model_shape("mixtral-8x7b").experts_per_rank(3, "--preset")
    with pytest.raises(SpecError, match="unknown model"):
        model_shape("gpt-5")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "gpt-5"], "unknown model 'gpt-5'"),
        (["--preset", "mixtral-8x7b", "--gpus", "3"], "8 experts do not split evenly over 3 ranks"),
        (["--backend", "nope"], "unknown backend"),
        (["--sms", "8,x"], "whole numbers"),
        (["--schedules", "tbo,zigzag"], "--schedules takes serial, tbo, chunked, expert"),
        (["--intermediate", "0"], "intermediate"),
        (["--topk", "9", "--experts-per-rank", "2", "--gpus", "2"], "topk"),
    ],
)
def test_bad_flags_are_one_error_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["tune", "--cpu", "--db", str(tmp_path / "t.duckdb"), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error:") and message in result.stderr, result.stderr
    assert not (tmp_path / "t.duckdb").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "--gpus must be > 0"),
        (["--iters", "0"], "--iters must be > 0"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--timeout", "0"], "--timeout must be > 0"),
        (["--hidden", "0"], "hidden must be a positive integer"),
        (["--tokens-per-rank", "2097152"], "tokens-per-rank 2097152 is above"),
        (["--routing", "sideways"], "unknown routing 'sideways'"),
        (["--dtype", "fp4"], "unknown payload dtype 'fp4'"),
    ],
)
def test_bad_flags_get_the_planners_one_line_error(tmp_path: Path, args: list[str], message: str) -> None:
    """tune plans every round with plan_run: a flag `moelab run` refuses is refused once, before round one."""
    result = CliRunner().invoke(
        app, ["tune", "--cpu", "--backend", "nccl-a2a", "--db", str(tmp_path / "t.duckdb"), "--out", str(tmp_path / "runs"), *args]
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "tune round" not in result.stdout
    assert not (tmp_path / "t.duckdb").exists() and not (tmp_path / "runs").exists()


def test_a_search_no_trial_of_can_run_is_refused_before_any_round(tmp_path: Path) -> None:
    """`--hidden 63 --dtype mxfp8`: every trial unsupported, found only after round one had run."""
    result = CliRunner().invoke(
        app, ["tune", "--cpu", "--backend", "mxfp8-a2a", "--hidden", "63", "--dtype", "mxfp8",
              "--db", str(tmp_path / "t.duckdb"), "--out", str(tmp_path / "runs")],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: tune: no trial can run at this shape (mxfp8-a2a: MXFP8 needs hidden divisible by 32, got 63)\n"
    )
    assert "tune round" not in result.stdout
    assert not (tmp_path / "t.duckdb").exists() and not (tmp_path / "runs").exists()


def test_rounds_are_planned_one_case_per_candidate_in_order(tmp_path: Path) -> None:
    timings = round_timings("cpu", 3, None)
    plan = plan_trials(
        request=RunRequest(backends=("deepep", "nccl-a2a"), cpu=True, timeout_s=60.0), host=HostFacts(),
        workload=Workload(hidden=256, tokens_per_rank=64, topk=4, experts_per_rank=4), dtypes={"deepep": "fp8"},
        intermediate=64, backward=False, first=coarse(["deepep", "nccl-a2a"], (8,), sm_control=False),
        final=timings[2], runs_root=tmp_path, db_path=tmp_path / "db.duckdb", tune_id="abc123",
    )  # fmt: skip
    assert (plan.launch.device, plan.launch.world, plan.launch.job_timeout_s) == ("cpu", 2, 60.0)
    cands = [Candidate.make("deepep", "tbo", 24, {"nvl_chunk": 32}), Candidate.make("nccl-a2a", "serial", None),
             Candidate.make("deepep", "serial", None)]  # fmt: skip
    spec = plan.spec_for(2, cands, timings[1])
    assert [(c.backend, c.sms, c.workload.dtype) for c in spec.cases] == [
        ("deepep", 24, "fp8"), ("nccl-a2a", None, "bf16"), ("deepep", None, "fp8")
    ]  # fmt: skip
    assert spec.cases[0].case_id == (
        "h256-t64-k4-e4-uniform-s0-fp8-sm24-bench=e2e-intermediate=64-mode=tbo-nvl_chunk=32-profile=layer"
    )
    assert [c.asked_knobs() for c in spec.cases] == [plan.knobs_for(c, "layer") for c in cands]
    assert (spec.suite, spec.label, spec.timing) == ("tune", "tune-abc123-r2", timings[1])
    assert not spec.health.snapshots
    with pytest.raises(SpecError, match="layuot"):  # a knob the backend does not know: the planner's check
        plan.spec_for(2, [Candidate.make("nccl-a2a", "tbo", None, {"layuot": "cached"})], timings[1])


def test_gpu_round_timings_are_unchanged() -> None:
    assert round_timings("cuda", None, None) == (
        TimingSpec(warmup=3, iters=10, flush_l2=True),
        TimingSpec(warmup=5, iters=20, flush_l2=True),
        TimingSpec(warmup=10, iters=50, flush_l2=True),
    )
    assert round_timings("cuda", 7, 0)[2] == TimingSpec(warmup=0, iters=7, flush_l2=True)


@pytest.mark.slow
def test_tune_on_cpu_ranks_stores_every_trial(tmp_path: Path) -> None:
    db, suite = tmp_path / "t.duckdb", tmp_path / "winner.toml"
    result = CliRunner().invoke(
        app,
        ["tune", "--cpu", "--backend", "nccl-a2a", "--hidden", "64", "--intermediate", "16",
         "--tokens-per-rank", "32", "--topk", "2", "--experts-per-rank", "2", "--iters", "3", "--repeat", "2",
         "--db", str(db), "--out", str(tmp_path / "runs"), "--suite-out", str(suite)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "winner:" in out and "margin over the runner-up" in out and "margin over the default" in out
    assert "over 2 starts:" in out  # the final round started each job twice: its margins have intervals
    assert "[backend." in out and "Megatron-Core" in out
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT run_id, label, suite FROM runs ORDER BY run_id").fetchall()
        trials = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'ok') FROM cases WHERE run_id IN (SELECT run_id FROM runs)"
        ).fetchone()
        labels = {r[0] for r in con.execute("SELECT label FROM labels").fetchall()}
        roofline = con.execute(
            "SELECT DISTINCT value, definition FROM case_metrics WHERE name = 'roofline_share'"
        ).fetchall()
    assert len(runs) >= 2 and all(r[2] == "tune" and r[1].startswith("tune-") for r in runs)
    assert labels == {r[1] for r in runs}
    # CPU ranks measure no GPU rates: the e2e roofline is stored as NULL with the reason, never invented
    assert roofline and all(
        v is None
        and d.endswith("not formed: this run measured no GPU rates (a CPU run, or peaks not measured)")
        for v, d in roofline
    )
    assert (
        trials is not None and trials[0] == trials[1] >= 4
    )  # round 1: 2 schedules; final: both again, the default among them
    report = write_report(db, [r[0] for r in runs], tmp_path / "report.html")
    assert "MoE layer: tokens/s vs communication SMs" in report.read_text()
    cases = expand(load_suite(str(suite)), ["nccl-a2a"], world=2)
    assert len(cases) == 1 and cases[0].kind == "e2e" and cases[0].workload.hidden == 64


@pytest.mark.slow
def test_ctrl_c_in_a_round_ends_the_tune_with_its_trials_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C stopped the round's job, then the search went on to the next round (or, in the final one, said
    no trial ran correctly, exit 2). It now ends the tune: the round stored as interrupted, exit 130."""
    from moelab.tune import trials

    real = trials.execute

    def interrupted(spec: Any, runs_root: Path, db_path: Path, progress: Any = print) -> Any:
        def tell(line: str) -> None:
            progress(line)
            if " cases on " in line:  # the job is starting: the user presses Ctrl-C
                os.kill(os.getpid(), signal.SIGINT)

        return real(spec, runs_root, db_path, progress=tell)

    monkeypatch.setattr(trials, "execute", interrupted)
    db = tmp_path / "t.duckdb"
    result = CliRunner().invoke(
        app,
        ["tune", "--cpu", "--backend", "nccl-a2a", "--hidden", "64", "--intermediate", "16",
         "--tokens-per-rank", "32", "--topk", "2", "--experts-per-rank", "2", "--iters", "3",
         "--db", str(db), "--out", str(tmp_path / "runs")],
    )  # fmt: skip
    assert result.exit_code == 130, result.output
    assert "tune stopped by SIGINT in run " in result.stdout and "tune round 2" not in result.stdout
    assert "no trial" not in result.output
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT status, label FROM runs").fetchall()
    assert len(runs) == 1 and runs[0][0] == "interrupted" and runs[0][1].endswith("-r1")
