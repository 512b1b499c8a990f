"""A dependency below the floor pyproject declares is one `error:` line and exit 2 before any command
runs (typer's own import included), never a traceback from deep inside. The floors are read from moelab's
installed metadata, so pyproject is the one place they are written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.core.floors import Floor, declared_floors, floors_of

REPO = Path(__file__).resolve().parent.parent.parent


def _floor(name: str) -> Floor:
    found = [f for f in declared_floors() if f.name == name]
    if not found:
        pytest.skip("moelab is not installed (no metadata to read its floors from)")
    return found[0]


def _older_than(version: str) -> str:
    """A version below `version` (its major or minor lowered)."""
    parts = [int(p) for p in version.split(".")[:2]] + [0]
    if parts[1] > 0:
        return f"{parts[0]}.{parts[1] - 1}.0"
    return f"{parts[0] - 1}.99.0"


def _installed_as(root: Path, name: str, version: str) -> Path:
    """A folder that makes `name` look installed at `version` to anything reading distribution metadata
    first from it (what pip leaves: NAME-VERSION.dist-info/METADATA)."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.parametrize("name", ["duckdb", "typer"])
def test_a_dependency_below_its_floor_is_one_error_line(tmp_path: Path, name: str) -> None:
    floor = _floor(name)
    old = _older_than(floor.version)
    fake = _installed_as(tmp_path / "site", name, old)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "moelab.cli.main", "runs", "--db", str(tmp_path / "m.duckdb")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: {name} {old} is installed, moelab needs {name}>={floor.version} "
        f"(pip install -U '{name}>={floor.version}')"
    ]
    assert not (tmp_path / "m.duckdb").exists()


def test_the_floors_are_read_as_pip_reads_them() -> None:
    floors = floors_of(
        [
            "duckdb>=1.2.1",
            "typer>=0.26,<0.30",
            "tomli>=2; python_version < '3.0'",  # a marker that does not apply here
            "pytest>=8; extra == 'test'",  # an extra's requirement
            "numpy",  # no floor
            "scipy>=1.9,>=1.11.2",
            "not a requirement ((",
        ]
    )
    assert floors == [Floor("duckdb", "1.2.1"), Floor("typer", "0.26"), Floor("scipy", "1.11.2")]


def test_every_runtime_dependency_has_a_floor() -> None:
    """The minimum-versions lane pins each floor; a dependency without one would go untested."""
    try:
        import tomllib
    except ModuleNotFoundError:  # python 3.10
        import tomli as tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    named = {d.split(";")[0].split(">")[0].split("<")[0].split("=")[0].strip() for d in deps}
    everywhere = {f.name for f in floors_of(deps)} | {"tomli"}  # tomli applies below python 3.11 only
    assert named == everywhere
