"""Every command in the README's ```bash blocks runs, in the README's order, on CPU.

A block preceded by `<!-- docs-test: gpu (why) -->` needs GPUs (skipped without CUDA); one preceded by
`<!-- docs-test: skip (why) -->` is not run here (the test suite itself). A leading
`python -m pip install ... &&` is dropped (the checkout under test is installed already). Commands share one
working folder and one store, so a later command reads what an earlier one stored (`--from-run nightly`,
`--baseline main`); `moelab` is this checkout's (`python -m moelab.cli.main`). A command passes when it
exits 0; `moelab check` may also give its verdict codes (1 regression, 3 cannot judge, 4 contended), never
2 (bad input). Slow: it makes the README's CPU runs for real.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = re.compile(r"<!-- docs-test: (gpu|skip) \((.*)\) -->")
PIP = re.compile(r"^python -m pip install .*? && ")
CHECK_VERDICTS = {0, 1, 3, 4}


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    mark: str | None  # gpu, skip or None
    why: str


def readme_commands(text: str) -> list[Command]:
    out: list[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            found = MARK.match(lines[i - 1].strip()) if i else None
            mark, why = (found.group(1), found.group(2)) if found else (None, "")
            i += 1
            pending = ""
            while lines[i].strip() != "```":
                pending += lines[i].rstrip()
                if pending.endswith("\\"):
                    pending = pending[:-1] + " "
                elif pending.strip():
                    out.append(Command(line=i + 1, text=pending.strip(), mark=mark, why=why))
                    pending = ""
                else:
                    pending = ""
                i += 1
        i += 1
    return out


COMMANDS = readme_commands(README.read_text())


def _param(c: Command) -> object:
    marks: list[pytest.MarkDecorator] = []
    if c.mark == "skip":
        marks.append(pytest.mark.skip(reason=c.why))
    elif c.mark == "gpu":
        marks += [pytest.mark.gpu, pytest.mark.skip(reason=f"GPU only: {c.why}")]
    return pytest.param(c, id=f"L{c.line}-{' '.join(c.text.split()[:3])}", marks=marks)


def _ends(text: str, keep: int = 3000) -> str:
    """A long output's head and tail: why a run failed is printed above its tables, its verdict below."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters ...]\n{text[-keep:]}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    (work / "results").symlink_to(ROOT / "results")  # the README's paths are relative to the checkout
    return work


def test_the_first_screen_holds_the_two_commands_and_the_first_run() -> None:
    first = "\n".join(README.read_text().splitlines()[:70])
    assert "moelab run --report report.html" in first and "python -m pytest -q" in first
    assert "```text" in first and "report:" in first  # what the first run prints, down to its report path


def test_every_block_is_marked_or_runs_on_cpu() -> None:
    assert len([c for c in COMMANDS if c.mark is None]) >= 10
    assert all(c.why for c in COMMANDS if c.mark)


@pytest.mark.slow
@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_readme_command_runs(command: Command, workdir: Path) -> None:
    text = PIP.sub("", command.text)
    env = {
        **os.environ,
        "MOELAB_DB": str(workdir / "moelab.duckdb"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "120",
    }
    script = f'moelab() {{ "{sys.executable}" -m moelab.cli.main "$@"; }}\n{text}\n'
    r = subprocess.run(
        ["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=1800
    )
    output = _ends(r.stdout) + _ends(r.stderr)
    assert "Traceback" not in r.stderr, output
    allowed = CHECK_VERDICTS if text.startswith("moelab check") else {0}
    assert r.returncode in allowed, f"README line {command.line}: `{text}` exited {r.returncode}\n{output}"
