"""--repeat and a suite's `repeat`: how many times each backend job starts, and in which order."""

from __future__ import annotations

from pathlib import Path

import pytest

from moelab.core.errors import SpecError
from moelab.plan.planning import HostFacts, RunRequest, plan_run


def _suite(tmp_path: Path, repeat: object) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(
        f"name = 's'\nrepeat = {repeat}\n[workload]\nhidden = 128\ntokens_per_rank = 16\ntopk = 2\n"
    )
    return path


def test_the_suite_sets_repeats_and_the_flag_wins(tmp_path: Path) -> None:
    suite = str(_suite(tmp_path, 3))
    spec = plan_run(RunRequest(suite=suite, cpu=True), HostFacts(), new_run_id="r").spec
    assert spec.launch.repeats == 3
    spec = plan_run(RunRequest(suite=suite, cpu=True, repeat=2), HostFacts(), new_run_id="r").spec
    assert spec.launch.repeats == 2
    assert plan_run(RunRequest(cpu=True), HostFacts(), new_run_id="r").spec.launch.repeats == 1


@pytest.mark.parametrize("bad", ["0", "-1", "'3'", "true", "1.5", "1001"])
def test_a_bad_suite_repeat_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SpecError, match="repeat must be a whole number from 1 to 1,000"):
        plan_run(RunRequest(suite=str(_suite(tmp_path, bad)), cpu=True), HostFacts(), new_run_id="r")


def test_jobs_rotate_one_place_per_start() -> None:
    req = RunRequest(backends=("nccl-a2a", "mxfp8-a2a", "torch-symm-a2a"), cpu=True, repeat=3)
    spec = plan_run(req, HostFacts(), new_run_id="r").spec
    order = [f"{b[0]}{k}" for b, k in spec.job_order()]
    assert order == ["n0", "m0", "t0", "m1", "t1", "n1", "t2", "n2", "m2"]  # A B C, B C A, C A B
