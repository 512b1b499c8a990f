"""Example paths in the README and in every command's --help exist in the repository (placeholders are
written in capitals: RUN_DIR, CASE, LABEL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app

ROOT = Path(__file__).resolve().parent.parent.parent
PATH_RE = re.compile(r"(?<![\w/.-])((?:results|benchmarks|containers|tests|moelab|\.ci)/[\w./-]*[\w/])")
COMMANDS = [["run"], ["check"], ["compare"], ["report"], ["label"], ["runs"], ["db", "export"], ["db", "query"],
            ["trace", "summarize"], ["doctor"], ["backends"]]  # fmt: skip


def _paths(text: str) -> set[str]:
    return {p for p in PATH_RE.findall(text) if not re.search(r"[A-Z]{3,}|<", p)}


def test_readme_paths_exist() -> None:
    missing = sorted(p for p in _paths((ROOT / "README.md").read_text()) if not (ROOT / p).exists())
    assert missing == []


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_paths_exist(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    missing = sorted(p for p in _paths(result.output) if not (ROOT / p).exists())
    assert missing == []
