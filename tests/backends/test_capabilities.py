"""What a backend may do beyond dispatch and combine is a type it has, and a host job is not a Backend:
the registry hands out classes whose capabilities are checked with isinstance, never looked up by name."""

from __future__ import annotations

import pytest

from moelab.backends import registry
from moelab.backends.base import Backend, HostJob
from moelab.backends.capabilities import (
    DefaultWorkload,
    DispatchAlongHandle,
    HandleDispatchReason,
    LibraryFigures,
)
from moelab.core.errors import MoelabError


def test_the_built_ins_declare_what_they_can_do() -> None:
    ll, deepep, hybrid, nccl = (registry.load(n) for n in ("deepep-ll", "deepep", "hybrid-ep", "nccl-a2a"))
    assert isinstance(ll, DefaultWorkload) and ll.default_workload["tokens_per_rank"] == 128
    assert not isinstance(nccl, DefaultWorkload)
    assert all(issubclass(c, DispatchAlongHandle) for c in (deepep, hybrid, nccl)) and not issubclass(
        ll, DispatchAlongHandle
    )
    assert issubclass(hybrid, HandleDispatchReason) and not issubclass(nccl, HandleDispatchReason)
    assert isinstance(deepep, LibraryFigures) and isinstance(hybrid, LibraryFigures)
    assert not isinstance(nccl, LibraryFigures)


def test_a_host_job_is_its_own_kind_with_no_dispatch() -> None:
    job = registry.load("nccl-tests")
    assert issubclass(job, HostJob) and not issubclass(job, Backend)
    assert not hasattr(job, "dispatch") and not hasattr(job, "combine")
    assert registry.host_jobs(["nccl-a2a", "nccl-tests", "no-such-backend"]) == ["nccl-tests"]
    with pytest.raises(MoelabError, match="is a host job"):
        registry.load_backend("nccl-tests")
    assert registry.load_backend("nccl-a2a") is registry.load("nccl-a2a")


def test_a_plugin_has_what_its_class_says(plugin_path: object) -> None:
    lib, host = registry.load("test-lib"), registry.load("test-host")
    assert isinstance(lib, LibraryFigures) and issubclass(lib, DispatchAlongHandle)
    assert lib.library_test is not None and issubclass(lib, Backend) and lib.tuning is not None
    assert issubclass(host, HostJob)
    assert registry.host_jobs(["test-host", "test-lib"]) == ["test-host"]
    names = [n for n, _ in registry.declared()]
    assert names[: len(registry.BUILTIN)] == list(registry.BUILTIN) and {"test-lib", "test-host"} <= set(
        names
    )
