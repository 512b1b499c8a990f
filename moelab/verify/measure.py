"""moelab's side of a verification: the same availability check and measurement `moelab run` makes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from moelab.backends import registry
from moelab.core.errors import MoelabError
from moelab.core.spec import LaunchSpec, RunSpec
from moelab.launch.runner import RunOutcome, execute
from moelab.verify.plan import library_test


def check_available(backends: tuple[str, ...], paths: Mapping[str, str], launch: LaunchSpec) -> None:
    """Raise MoelabError (one line, exit 2) when a backend cannot run here or its library tree lacks its test.
    A test in the library's source tree needs that tree (--backend-path NAME=DIR), checked in a child process
    with DIR first, as the backend's job runs; any other is found as the backend's job finds its tool."""
    for name in backends:
        test = library_test(name)
        if not test.in_tree:
            reason = registry.availability(name, launch=launch)
        else:
            if name not in paths:
                raise MoelabError(
                    f"verify {name}: give the library's source tree with --backend-path {name}=DIR (its {test.test} is run)"
                )
            found = Path(paths[name]) / test.test
            if not found.is_file():
                raise MoelabError(
                    f"verify {name}: {found} not found (--backend-path {name} must be the library's source tree)"
                )
            reason = registry.availability(name, paths[name])
        if reason:
            raise MoelabError(f"backend {name} is unavailable: {reason}")


def run_moelab(spec: RunSpec, runs_root: Path, db_path: Path, progress: Callable[[str], None]) -> RunOutcome:
    return execute(spec, runs_root, db_path, progress=progress)
