"""`moelab run --sbatch`: the batch script runs moelab by the absolute interpreter path (a compute node's
PATH lacks the entry point), and, where a one-host SLURM cluster answers (.ci/slurm-setup.sh), the
script itself runs under sbatch and stores its run."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.job.launchers import cli_by_interpreter
from tests.launch.test_crash_isolation import SMALL
from tests.launch.test_slurm_real import _cluster_ready


def _script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> str:
    args = [
        "run",
        "--sbatch",
        "--dry-run",
        "--cpu",
        "--out",
        str(tmp_path / "runs"),
        "--no-health",
        *SMALL,
        *extra,
    ]
    monkeypatch.setattr(sys, "argv", ["moelab", *args])  # the run records the command it was given
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output[result.output.index("#!/bin/bash") :]


def test_batch_script_calls_the_interpreter_not_the_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path, monkeypatch, "--run-id", "sb1")
    body = [line for line in script.splitlines() if line and not line.startswith(("#", "set "))]
    assert len(body) == 1
    words = shlex.split(body[0])
    assert words[:3] == [sys.executable, "-m", "moelab.cli.main"] and Path(words[0]).is_absolute()
    assert words[3] == "run" and "moelab" not in words[:1]
    assert words[words.index("--launcher") + 1] == "slurm" and words[words.index("--run-id") + 1] == "sb1"
    assert "--sbatch" not in words and "--dry-run" not in words


def test_only_a_bare_moelab_command_is_rewritten() -> None:
    assert cli_by_interpreter(["moelab", "run", "-b", "x"], "/py") == [
        "/py",
        "-m",
        "moelab.cli.main",
        "run",
        "-b",
        "x",
    ]
    assert cli_by_interpreter(["srun", "moelab"], "/py") == ["srun", "moelab"]
    assert cli_by_interpreter([], "/py") == []


@pytest.mark.slow
@pytest.mark.skipif(not _cluster_ready(), reason="no reachable SLURM controller with an idle node")
def test_generated_script_runs_under_sbatch(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path, monkeypatch, "--run-id", "sbatch-real", "--time", "10")  # stays in the header
    path = tmp_path / "run.sbatch"
    path.write_text(script)
    # PATH without the environment's bin folder: the script must not need the `moelab` entry point
    env_path = ":".join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())
    done = subprocess.run(
        ["sbatch", "--wait", f"--output={tmp_path / 'out-%j.txt'}", str(path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PATH": env_path + ":" + str(Path(shutil.which("sbatch") or "/usr/bin/sbatch").parent),
             "MOELAB_DB": str(db_path), "HOME": str(tmp_path)},
    )  # fmt: skip
    out = "".join(p.read_text() for p in tmp_path.glob("out-*.txt"))
    assert done.returncode == 0, done.stderr + out[-3000:]
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'sbatch-real'").fetchone() == ("complete",)
    finally:
        con.close()
