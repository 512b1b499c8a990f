"""A --backend-path folder that holds a library's source but not its compiled extension (DeepEP cloned and
never built) is one `error:` line naming the build step, before any import or GPU check, through the
commands that take --backend-path; a built tree goes on to the usual checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.backends import registry

REPO = Path(__file__).resolve().parent.parent.parent
STEP = "python setup.py build_ext --inplace"


def deepep_source(root: Path) -> Path:
    """A DeepEP checkout as `git clone` leaves it: setup.py and the deep_ep package, nothing compiled."""
    tree = root / "DeepEP"
    (tree / "deep_ep").mkdir(parents=True)
    (tree / "setup.py").write_text("from setuptools import setup\n")
    (tree / "deep_ep" / "__init__.py").write_text("import deep_ep_cpp  # the extension build_ext makes\n")
    (tree / "tests").mkdir()
    for test in ("test_intranode.py", "test_internode.py", "test_low_latency.py"):
        (tree / "tests" / test).write_text("raise SystemExit('not for this test')\n")
    return tree


def moelab(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MOELAB_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "moelab.cli.main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("backend", ["deepep", "deepep-ll", "hybrid-ep"])
def test_run_with_an_unbuilt_source_tree_names_the_build_step(tmp_path: Path, backend: str) -> None:
    tree = deepep_source(tmp_path)
    done = moelab(
        "run", "--cpu", "--backend", backend, "--backend-path", f"{backend}={tree}",
        "--out", str(tmp_path / "runs"), "--db", str(tmp_path / "m.duckdb"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: backend {backend} is unavailable: {tree} holds deep_ep's source but not its compiled "
        f"library (deep_ep_cpp*.so or deep_ep/_C*.so): run `{STEP}` in {tree}"
    ]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_verify_with_an_unbuilt_source_tree_names_the_build_step(tmp_path: Path) -> None:
    tree = deepep_source(tmp_path)
    done = moelab(
        "verify", "--backend", "deepep", "--backend-path", f"deepep={tree}", "--db", str(tmp_path / "m.duckdb"),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"run `{STEP}` in {tree}" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_built_tree_or_an_install_is_not_sent_to_build(tmp_path: Path) -> None:
    tree = deepep_source(tmp_path)
    (tree / "deep_ep_cpp.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    cls = registry.load("deepep")
    assert cls.unbuilt(tree) is None
    v2 = deepep_source(tmp_path / "v2")
    (v2 / "deep_ep" / "_C.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    assert cls.unbuilt(v2) is None
    site = tmp_path / "site"  # an installed deep_ep: no setup.py beside it
    (site / "deep_ep").mkdir(parents=True)
    assert cls.unbuilt(site) is None
    assert registry.load("nccl-a2a").unbuilt(deepep_source(tmp_path / "other")) is None
    reason = registry.availability("deepep", str(tree))
    assert reason is not None and STEP not in reason
