"""A flag that only another flag (or another launcher) reads is refused without it, through `moelab run`:
`--time` without `--sbatch`, `--trace-iters` without `--trace torch`, `--node-rank` outside torchrun and
`--container-image` outside srun were each ignored without a word. And the pyxis container, which only
reached a unit test of the srun argv, now reaches the srun that `moelab run --launcher slurm` starts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.cli.run_cmd import without_flags
from moelab.job.launchers import slurm_time_problem
from tests.argv import with_flags
from tests.launch.test_crash_isolation import SMALL


def _run(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    args = [
        "run",
        *with_flags(["--cpu", "--dry-run", "--no-health", "--out", str(tmp_path / "runs"), *SMALL], *extra),
    ]
    res = CliRunner().invoke(app, args)
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--time", "1:00:00"], "--time: read only by --sbatch"),
        (["--partition", "gpu", "--account", "moe"], "--partition, --account: read only by --sbatch"),
        (["--sbatch", "--time", "99:99:99"], "--time '99:99:99': minutes 99 must be under 60"),
        (["--sbatch", "--time", "1-24"], "hours 24 must be under 24"),
        (["--sbatch", "--time", "1h"], "not a SLURM time limit"),
        (["--container-image", "img"], "pyxis containers start under srun"),
        (["--launcher", "torchrun", "--container-image", "img"], "--launcher is torchrun"),
        (["--launcher", "slurm", "--container-mounts", "/a:/b"], "give both"),
        (["--sbatch", "--container-image", "img", "--container-mounts", ","], "names no SRC:DST mount"),
        (["--trace-iters", "3"], "--trace-iters counts the iterations --trace torch profiles"),
        (["--trace", "nsys", "--trace-iters", "3"], "(--trace is nsys)"),
        (["--node-rank", "1"], "--node-rank is torchrun's"),
        (["--iters", "3", "--max-iters", "10"], "--max-iters bounds the stop on a stable median"),
        (
            ["--iters", "3", "--noise-target", "0.1", "--max-iters", "9"],
            "--max-iters and --noise-target bound",
        ),
        (["--launcher", "slurm", "--rdzv-endpoint", "h:29500"], "--rdzv-endpoint is torchrun's or mpirun's"),
    ],
)
def test_a_flag_its_run_would_not_read_is_refused(tmp_path: Path, extra: list[str], needle: str) -> None:
    code, out, err = _run(tmp_path, *extra)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, out + err
    assert needle in err, err
    assert not (tmp_path / "runs").exists()


def test_srun_starts_every_rank_in_the_container(tmp_path: Path) -> None:
    code, out, err = _run(
        tmp_path, "--launcher", "slurm", "--container-image", "nvcr.io#nvidia/pytorch:25.01-py3",
        "--container-mounts", "/data:/data,/scratch:/s",
    )  # fmt: skip
    assert code == 0, out + err
    srun = [shlex.split(line) for line in out.splitlines() if line.startswith("srun ")]
    assert srun, out
    for words in srun:
        assert words[words.index("--container-image") + 1] == "nvcr.io#nvidia/pytorch:25.01-py3"
        assert words[words.index("--container-mounts") + 1] == "/data:/data,/scratch:/s"
        assert words.index("--container-image") < words.index(sys.executable)  # srun's flag, not the worker's


def test_the_batch_script_keeps_its_header_flags_out_of_the_command_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [
        "run", "--sbatch", "--dry-run", "--cpu", "--no-health", "--out", str(tmp_path / "runs"), *SMALL,
        "--time=2-12:30", "--partition", "gpu", "--account", "moe", "--container-image", "img",
        "--launcher", "slurm", "--nodes", "1", "--gpus-per-node", "2", "--run-id", "mine",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["moelab", *args])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    script = res.output[res.output.index("#!/bin/bash") :]
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"#SBATCH --time=2-12:30", "#SBATCH --partition=gpu", "#SBATCH --account=moe"} <= set(header)
    body = [line for line in script.splitlines() if line and not line.startswith(("#", "set "))]
    words = shlex.split(body[0])
    # the command inside the allocation has no --sbatch, so it must not carry flags only --sbatch reads
    assert not {"--time", "--time=2-12:30", "--partition", "--account", "gpu", "moe"} & set(words)
    assert words[words.index("--container-image") + 1] == "img"  # its srun starts the ranks in it
    # the launch it appends replaces the user's own: the run inside would refuse a flag given twice
    for flag, value in (
        ("--launcher", "slurm"),
        ("--nodes", "1"),
        ("--gpus-per-node", "2"),
        ("--run-id", "mine"),
    ):
        assert words.count(flag) == 1 and words[words.index(flag) + 1] == value, words
    inside = CliRunner().invoke(app, [*words[3:], "--dry-run"])  # as the allocation runs it, less the jobs
    assert inside.exit_code == 0 and "--container-image img" in inside.stdout, inside.output


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("00:30:00", True), ("90", True), ("90:30", True), ("36:00:00", True), ("1-12", True),
        ("2-00:30", True), ("2-00:30:59", True), ("UNLIMITED", True), ("99:99:99", False),
        ("00:30:60", False), ("1-24", False), ("2-00:60", False), ("", False), ("-1", False),
        ("1:2:3:4", False), ("1.5", False), (" 10", False), ("10\n", False), ("\u0661\u0660", False),
    ],
)  # fmt: skip
def test_slurm_time_forms(text: str, ok: bool) -> None:
    assert (slurm_time_problem(text) is None) is ok


def test_without_flags_drops_values_both_ways_and_leaves_what_follows_a_double_dash() -> None:
    argv = ["run", "--time", "1:00", "--sbatch", "--partition=gpu", "-b", "x", "--", "--time", "5"]
    assert without_flags(argv, ("--sbatch",), ("--time", "--partition")) == [
        "run", "-b", "x", "--", "--time", "5",
    ]  # fmt: skip
