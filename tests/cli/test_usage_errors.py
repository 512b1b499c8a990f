"""A flag typer cannot parse is one `error:` line and exit 2, like every other user error."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["run", "--iters", "many"], "Invalid value for '--iters'"),
        (["run", "--timeout", "abc"], "Invalid value for '--timeout'"),
        (["run", "--no-such-flag"], "No such option"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], match: str) -> None:
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], res.output


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["check", "-B", "v1", "-B", "v2"], "--baseline/-B"),  # judged against v2 alone
        (["check", "--baseline", "v1", "-B", "v2"], "--baseline/-B"),
        (["run", "--cpu", "--dry-run", "--health", "--no-health"], "--health/--no-health"),
        (["run", "--cpu", "--dry-run", "--iters", "2", "--iters=3"], "--iters"),
        (["model", "--nodes", "2", "--nodes", "4"], "--nodes"),
        (["report", "-o", "a.html", "-o", "b.html"], "--out/-o"),
    ],
)
def test_an_option_of_one_value_given_twice_is_refused(argv: list[str], name: str) -> None:
    """click keeps the last value without a word: `check -B v1 -B v2` read as two baselines to a user."""
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {name} is given more than once: give it once"), res.stderr
    assert res.stderr.count("\n") == 1


def test_an_option_that_takes_many_may_be_repeated(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["run", "--cpu", "--dry-run", "--out", str(tmp_path), "--case", "a", "--case", "b"]
    )
    assert "given more than once" not in res.output and "no case 'a'" in res.stderr, res.output


def test_help_still_works() -> None:
    res = CliRunner().invoke(app, ["run", "--help"])
    assert res.exit_code == 0 and "Workload" in res.output and "Launch" in res.output


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--db", ""],  # was the user's own store (MOELAB_DB, else the data directory)
        ["runs", "--db="],
        ["run", "--cpu", "--dry-run", "--out", ""],  # was the data directory's runs/
        ["run", "--cpu", "--dry-run", "--report", ""],  # was no report, silently
        ["check", "-B", "base", "--run", ""],  # was the newest run
        ["model", "--from-run", ""],  # was the default topology, not a run's
        ["report", "--gpu", "", "-o", "r.html"],
        ["db", "query", ""],  # was `ok`
        ["ingest", ""],
        ["label", "", "main"],
    ],
)
def test_an_empty_value_is_refused_not_taken_as_not_given(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOELAB_DB", str(tmp_path / "store.duckdb"))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, argv)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: ") and " is empty" in lines[0], res.output
    assert list(tmp_path.iterdir()) == []


def test_an_empty_prefix_still_means_every_range() -> None:
    res = CliRunner().invoke(app, ["trace", "summarize", "missing.json", "--prefix", ""])
    assert "is empty" not in res.output


@pytest.mark.parametrize(
    "command", [["run", "--cpu", "--no-health"], ["tune", "--cpu", "--backend", "nccl-a2a"]]
)
def test_an_out_that_is_a_file_is_one_line(tmp_path: Path, command: list[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("kept\n")
    res = CliRunner().invoke(app, [*command, "--out", str(afile), "--db", str(tmp_path / "m.duckdb")])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: --out {afile} is a file: give the folder run directories go in\n"
    assert afile.read_text() == "kept\n" and not (tmp_path / "m.duckdb").exists()
