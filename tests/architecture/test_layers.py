"""The layer contract (.importlinter) holds on the package, and it is no decoration: an upward import
hidden inside a function, or a cycle between two sibling modules, breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "moelab", tmp_path / "moelab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_package_keeps_its_layers() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BROKEN" not in done.stdout


def test_an_upward_import_inside_a_function_breaks_the_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    with (root / "moelab" / "core" / "workload.py").open("a") as fh:
        fh.write("\n\ndef _sneaky() -> None:\n    from moelab.store import db  # noqa: F401\n")
    done = _lint(root)
    assert done.returncode != 0
    assert "moelab.core.workload -> moelab.store.db" in done.stdout


def test_a_cycle_between_siblings_breaks_the_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    with (root / "moelab" / "core" / "workload.py").open("a") as fh:  # spec.py imports workload.py
        fh.write("\n\ndef _loop() -> None:\n    from moelab.core import spec  # noqa: F401\n")
    done = _lint(root)
    assert done.returncode != 0
    assert "No cycles are allowed in moelab.core" in done.stdout


def test_a_new_package_that_no_layer_names_breaks_the_contract(tmp_path: Path) -> None:
    """exhaustive = true: a package nothing imports (reached only by an importlib string, or not yet at
    all) still has to be given its layer."""
    root = _copy(tmp_path)
    (root / "moelab" / "orphan").mkdir()
    (root / "moelab" / "orphan" / "__init__.py").write_text('"""Imported by no module of moelab."""\n')
    done = _lint(root)
    assert done.returncode != 0
    assert "moelab.orphan" in done.stdout and "exhaustive" in done.stdout
