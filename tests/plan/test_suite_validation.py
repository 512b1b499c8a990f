"""A suite file the store could not keep, or that would silently do something else, is refused at planning
with one `error:` line, before anything runs: every value's type, unknown keys in every table ([[exclude]]
included), nesting, size, and the number of cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app

TWENTY = "[" + ", ".join(str(i + 1) for i in range(20)) + "]"
TOO_MANY = "\n".join(f"{k} = {TWENTY}" for k in ("tokens_per_rank", "seed", "topk", "experts_per_rank"))
BASE = 'name = "t"\n[workload]\nhidden = 128\ntokens_per_rank = 16\ntopk = 2\nexperts_per_rank = 2\n'


def _run(tmp_path: Path, body: str | None, *, suite: str | None = None) -> tuple[int, str]:
    if body is not None:
        (tmp_path / "s.toml").write_text(body)
    args = [
        "run",
        "--cpu",
        "--dry-run",
        "--suite",
        suite or str(tmp_path / "s.toml"),
        "--out",
        str(tmp_path / "runs"),
    ]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (BASE + '[axes]\nseed = ["abc"]\n', "seed must be a whole number"),
        (BASE + "[axes]\nseed = [true]\n", "seed must be a whole number"),
        (BASE + "[axes]\nseed = [1.5]\n", "seed must be a whole number"),
        (BASE + "[axes]\nseed = [[1, 2]]\n", "seed must be a whole number"),
        (BASE + "[axes]\nseed = [99999999999]\n", "seed must be a whole number from 0 to 2147483647"),
        (BASE + "[axes]\nseed = [1979-05-27T07:32:00Z]\n", "a datetime is none of them"),
        (BASE + "[axes]\nseed = [1979-05-27]\n", "a date is none of them"),
        (BASE + "[axes]\nzipf_s = [nan]\n", "suite numbers must be finite"),
        (BASE + "[axes]\nhidden = [inf]\n", "suite numbers must be finite"),
        (BASE + "[axes]\ndtype = [5]\n", "dtype must be a name"),
        (BASE + '[axes]\nrouting = [["uniform"]]\n', "routing must be a name"),
        (BASE + "[backend.nccl-a2a.axes]\nexchange = [07:32:00]\n", "a time is none of them"),
        (BASE + "[axes]\nsms = [8, 16]\n[[exclude]]\nsmz = 8\n", "[[exclude]] number 1 names 'smz'"),
        (BASE + "[[exclude]]\n", "[[exclude]] number 1 is empty"),
        # a value none of the file's own can equal: it excluded nothing, without a word
        (
            BASE + "[axes]\nhidden = [128, 256]\n[[exclude]]\nhidden = 512\n",
            "[[exclude]] number 1: hidden = 512 is none of this suite's values of hidden (128, 256)",
        ),
        (BASE + '[axes]\nsms = ["default", 16]\n[[exclude]]\nsms = "16"\n', "sms = '16' is none of"),
        (
            BASE + '[backend.nccl-a2a.axes]\nexchange = ["splits"]\n[[exclude]]\nexchange = "split"\n',
            "exchange = 'split' is none of this suite's values of exchange ('splits')",
        ),
        (BASE + "[axes]\nsms = [false]\n", "sms must be a whole number"),  # false == 0: was 'default'
        (BASE + "[axes]\nsms = [0.0]\n", "sms must be a whole number"),
        (
            BASE + "[backend.nccl-a2a.workload]\n[backend.nccl-a2a.axes]\nsms = [false, 8]\n",
            "sms must be a whole",
        ),
        (
            BASE + "[backend.nccl-a2a.workload]\nhiden = 256\n",
            "unknown workload key 'hiden' in [backend.nccl-a2a.workload]",
        ),
        (BASE + "[axes]\nhidden = " + "[" * 40 + "1" + "]" * 40 + "\n", "nested deeper than any suite"),
        (BASE + "[axes]\nhidden = " + "[" * 3000 + "1" + "]" * 3000 + "\n", "nested deeper than any suite"),
        (BASE + "[axes]\n" + TOO_MANY, "more than 100,000 cases"),
    ],
)
def test_bad_suite_values_are_one_error_line(tmp_path: Path, body: str, needle: str) -> None:
    code, stderr = _run(tmp_path, body)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert needle in lines[0]
    assert not (tmp_path / "runs").exists()


def test_an_exclude_naming_a_knob_or_axis_is_kept(tmp_path: Path) -> None:
    body = (
        BASE + '[axes]\nsms = ["default", 8]\n[backend.nccl-a2a.axes]\nexchange = ["splits", "allgather"]\n'
    )
    body += '[[exclude]]\nexchange = "splits"\nsms = 8\n'
    (tmp_path / "s.toml").write_text(body)
    result = CliRunner().invoke(app, ["run", "--cpu", "--list-cases", "--suite", str(tmp_path / "s.toml")])
    assert result.exit_code == 0, result.output
    assert "3 cases" in result.output


@pytest.mark.parametrize(
    ("axis", "exclude"), [('"default"', "0"), ("0", '"default"'), ('"default"', '"default"')]
)
def test_an_sm_exclude_matches_the_default_however_written(tmp_path: Path, axis: str, exclude: str) -> None:
    """`sms = 0` and `sms = "default"` are one setting in a case: an exclude of either drops it."""
    body = BASE + f"[axes]\nsms = [{axis}, 8]\n[[exclude]]\nsms = {exclude}\n"
    (tmp_path / "s.toml").write_text(body)
    result = CliRunner().invoke(app, ["run", "--cpu", "--list-cases", "--suite", str(tmp_path / "s.toml")])
    assert result.exit_code == 0, result.output
    assert "1 cases" in result.output and "smdef" not in result.output


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_file_is_no_suite(tmp_path: Path, path: str) -> None:
    code, stderr = _run(tmp_path, None, suite=path)
    assert code == 2 and stderr.strip() == f"error: cannot read suite file {path}: not a regular file"


def test_a_huge_file_is_no_suite(tmp_path: Path) -> None:
    code, stderr = _run(tmp_path, BASE + "#" * (2 << 20) + "\n")
    assert code == 2 and "larger than 1024 KiB" in stderr
