"""`moelab run` exit codes that mean something: input refused before anything runs (a backend named twice,
a run id that is a path, a label with control characters), and a run that measured nothing is no success."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.argv import with_flags
from tests.launch.test_crash_isolation import SMALL


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--backend", "nccl-a2a,nccl-a2a"], "nccl-a2a more than once"),
        (["--run-id", "../../escaped-run"], "is not a plain name"),
        (["--run-id", "a/b"], "is not a plain name"),
        (["--kernel-cache", "/dev/null"], "--kernel-cache /dev/null: not a folder"),
        (["--repeat", "0"], "--repeat must be > 0, got 0"),
        (
            ["--require-healthy", "--no-health"],
            "--require-healthy judges the health snapshot",
        ),  # was no check
        (["--nsys-osrt"], "--nsys-osrt needs --trace nsys"),
        (["--label", "\x1b[31mRED\x1b]0;pwned-title\x07\x1b[2J"], "holds control characters"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(
    tmp_path: Path, db_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "deep" / "runs"
    result = CliRunner().invoke(app, ["run", "--cpu", "--out", str(out), *with_flags(SMALL, *extra)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "\x1b" not in result.output
    assert not (tmp_path / "deep").exists() and not (tmp_path / "escaped-run").exists()
    assert not db_path.exists()


@pytest.mark.slow
def test_nothing_measured_exits_1_unless_allowed(tmp_path: Path, db_path: Path) -> None:
    """mxfp8 needs a hidden size that is a multiple of 32: the only case is unsupported at run time."""
    args = ["run", "--cpu", "--backend", "mxfp8-a2a", "--out", str(tmp_path / "runs"), "--no-health",
            *with_flags(SMALL, "--hidden", "100")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert (
        "error: nothing was measured: every case is unsupported or skipped (1 unsupported)" in result.output
    )
    allowed = CliRunner().invoke(app, [*args, "--allow-empty"])
    assert allowed.exit_code == 0, allowed.output
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        assert con.execute("SELECT DISTINCT status FROM cases").fetchall() == [("unsupported",)]
    finally:
        con.close()
