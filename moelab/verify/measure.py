"""moelab's side of a verification: the same availability check and measurement `moelab run` makes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from moelab.core.errors import MoelabError
from moelab.core.spec import RunSpec
from moelab.launch.runner import RunOutcome, execute


def check_available(backends: tuple[str, ...], paths: Mapping[str, str], nccl_tests_bin: str | None) -> None:
    """Raise MoelabError (one line, exit 2) when a backend cannot run here or its library tree lacks its test."""
    from moelab.verify.libraries import library_test

    for name in backends:
        if name == "nccl-tests":
            from moelab.backends.nccl_tests_job import availability

            reason = availability(nccl_tests_bin)
        else:
            from moelab.backends import registry

            if name not in paths:
                raise MoelabError(
                    f"verify {name}: give the library's source tree with --backend-path {name}=DIR (its {library_test(name)} is run)"
                )
            test = Path(paths[name]) / library_test(name)
            if not test.is_file():
                raise MoelabError(
                    f"verify {name}: {test} not found (--backend-path {name} must be the library's source tree)"
                )
            reason = registry.availability(name, paths[name])
        if reason:
            raise MoelabError(f"backend {name} is unavailable: {reason}")


def run_moelab(spec: RunSpec, runs_root: Path, db_path: Path, progress: Callable[[str], None]) -> RunOutcome:
    return execute(spec, runs_root, db_path, progress=progress)
