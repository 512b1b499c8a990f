"""Model presets (moelab.core.models): one table for `moelab run --model` and `moelab tune --preset`, each
shape split over the ranks, refused in one line where the ranks do not divide its experts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.errors import SpecError
from moelab.core.models import MODELS, model_shape
from moelab.core.spec import CaseSpec
from moelab.plan.planning import HostFacts, RunRequest, plan_run

PUBLISHED = {  # (hidden, expert intermediate, routed experts, topk) from each model's config.json
    "deepseek-v3": (7168, 2048, 256, 8),
    "qwen3-235b-a22b": (4096, 1536, 128, 8),
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "gpt-oss-120b": (2880, 2880, 128, 4),
    "reference": (8192, 2048, 8, 8),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_model_has_its_published_shape_and_source(name: str) -> None:
    m = MODELS[name]
    assert (m.hidden, m.intermediate, m.num_experts, m.topk) == PUBLISHED[name]
    assert name == "reference" or m.source.startswith("https://huggingface.co/")
    assert m.source in m.describe(1)
    for world in (1, 2, 4, 8):
        assert m.experts_per_rank(world) * world == m.num_experts
    assert set(MODELS) == set(PUBLISHED)


@pytest.mark.parametrize(("name", "world"), [("mixtral-8x7b", 3), ("mixtral-8x7b", 16), ("deepseek-v3", 6)])
def test_a_rank_count_that_does_not_divide_the_experts_is_refused(name: str, world: int) -> None:
    with pytest.raises(SpecError, match=f"--model {name}: .* experts do not split evenly over {world} ranks"):
        model_shape(name).experts_per_rank(world)
    with pytest.raises(SpecError, match="unknown model 'gpt-5': choose one of deepseek-v3"):
        model_shape("gpt-5")


def _plan(**kw: Any) -> list[CaseSpec]:
    req = RunRequest(suite="e2e", backends=("nccl-a2a",), **kw)
    return list(plan_run(req, HostFacts(), new_run_id="r").spec.cases)


def test_model_sets_the_workload_and_the_e2e_expert_width() -> None:
    cases = _plan(model="deepseek-v3")  # 2 CPU ranks: 128 experts each
    assert cases and all(
        c.workload.hidden == 7168 and c.workload.topk == 8 and c.workload.experts_per_rank == 128
        for c in cases
    )
    assert all(c.e2e and c.e2e.intermediate == 2048 and "intermediate=2048" in c.case_id for c in cases)
    # a workload flag given beside the model wins; cases without experts (dispatch/combine) get no width
    mine = _plan(model="deepseek-v3", workload={"experts_per_rank": [4], "hidden": [1024]})
    assert all(c.workload.experts_per_rank == 4 and c.workload.hidden == 1024 for c in mine)
    plain = plan_run(
        RunRequest(suite="dispatch-combine", model="mixtral-8x7b"), HostFacts(), new_run_id="r"
    ).spec
    assert all(
        c.workload.topk == 2 and c.e2e is None and "intermediate" not in c.case_id for c in plain.cases
    )
    assert any("model mixtral-8x7b" in n and "huggingface.co/mistralai" in n for n in plain.notes)


def test_run_model_flag(tmp_path: Path) -> None:
    """Through the command: the cases it plans, the note it prints and stores, its one-line errors."""
    base = ["run", "--cpu", "--suite", "e2e", "--backend", "nccl-a2a", "--out", str(tmp_path / "runs")]
    listed = CliRunner().invoke(app, [*base, "--model", "qwen3-235b-a22b", "--list-cases"])
    assert listed.exit_code == 0, listed.output
    assert "h4096-t4096-k8-e64-uniform-s0-bf16-smdef-bench=e2e-intermediate=1536-mode=tbo" in listed.output
    dry = CliRunner().invoke(app, [*base, "--model", "gpt-oss-120b", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert (
        "note: model gpt-oss-120b: hidden 2880, expert intermediate 2880, 128 routed experts (64 per rank"
        in (" ".join(dry.output.split()))
    )
    for args, message in (
        (
            ["--model", "mixtral-8x7b", "--gpus", "3"],
            "error: --model mixtral-8x7b: 8 experts do not split evenly",
        ),
        (["--model", "llama"], "error: unknown model 'llama'"),
    ):
        bad = CliRunner().invoke(app, [*base, *args])
        assert bad.exit_code == 2 and bad.stderr.startswith(message), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
