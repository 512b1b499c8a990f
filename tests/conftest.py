from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # triton's kernels (moelab.measure.e2e.triton_kernels) run on its CPU interpreter in these tests; triton
    # reads the switch when it is first imported, so it is set before any test can import it.
    os.environ.setdefault("TRITON_INTERPRET", "1")

PLUGIN_SRC = Path(__file__).parent / "plugins" / "moelab_testplugins.py"

ENTRY_POINTS = """[moelab.backends]
test-segv = moelab_testplugins:SegfaultBackend
test-raise = moelab_testplugins:RaiseBackend
test-hang = moelab_testplugins:HangBackend
test-hang-all = moelab_testplugins:HangAllBackend
test-ctor-raise = moelab_testplugins:CtorRaiseBackend
test-abort = moelab_testplugins:AbortBackend
test-jit = moelab_testplugins:JitBackend
test-spawner = moelab_testplugins:SpawnerBackend
test-stop = moelab_testplugins:StopBackend
test-exit0 = moelab_testplugins:ExitZeroBackend
test-lib = moelab_testplugins:LibraryTestedBackend
test-host = moelab_testplugins:ToolHostJob
"""


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding the test backends and a dist-info with their entry points, on sys.path and
    PYTHONPATH (so torchrun's workers find them too)."""
    root = tmp_path / "plugins"
    dist = root / "moelab_testplugins-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: moelab-testplugins\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    shutil.copy(PLUGIN_SRC, root / "moelab_testplugins.py")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


@pytest.fixture
def db_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "db" / "moelab.duckdb"
    monkeypatch.setenv("MOELAB_DB", str(path))
    return path


@pytest.fixture(autouse=True)
def _console_width_restored() -> Iterator[None]:
    """A test that sets the shared console's width (rich keeps it in `_width`) leaves it as it found it: a
    width read back and set again would fix the console's width for every later test."""
    from moelab.cli.common import console

    saved = console._width
    yield
    console._width = saved
