"""moelab's kernel store: kernels a library JIT-built into a per-process folder survive into the next
process (Hybrid-EP recompiled every configuration in every job, about 13 s per case on 2xH200)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import moelab
from moelab.backends import hybrid_ep as hybrid_ep_module
from moelab.backends.base import BackendContext, CaseConfig
from moelab.backends.hybrid_ep_handle import PermuteHandle, PlainHandle
from moelab.backends.jit_cache import KernelStore, build_identity, hybrid_ep_process_folder
from moelab.core.errors import SpecError
from moelab.core.workload import Workload
from moelab.plan.planning import resolve_kernel_cache


def _store(tmp_path: Path, pid: int) -> KernelStore:
    return KernelStore(store=tmp_path / "store", process=tmp_path / "jit" / f"proc-{pid}")


def test_a_kernel_compiled_in_one_process_is_seeded_into_the_next(tmp_path: Path) -> None:
    first = _store(tmp_path, 100)
    assert first.seed() == 0
    (first.process / "dispatch_key_a.so").write_bytes(b"kernel a")
    (first.process / "dispatch_key_a-rank-0-node-0-123-x.so").write_bytes(b"not yet renamed")
    assert first.harvest() == 1
    assert first.harvest() == 0  # idempotent
    second = _store(tmp_path, 200)
    assert second.seed() == 1
    assert (second.process / "dispatch_key_a.so").read_bytes() == b"kernel a"
    assert not any(p.name.startswith(".") for p in (tmp_path / "store").iterdir())  # no temporary left
    assert second.cached() == 1


def test_seed_keeps_what_the_process_folder_already_has(tmp_path: Path) -> None:
    s = _store(tmp_path, 1)
    s.store.mkdir(parents=True)
    (s.store / "k.so").write_bytes(b"store")
    s.process.mkdir(parents=True)
    (s.process / "k.so").write_bytes(b"fresh")
    assert s.seed() == 0
    assert (s.process / "k.so").read_bytes() == b"fresh"


def test_the_build_identity_follows_sources_binaries_and_facts(tmp_path: Path) -> None:
    src = tmp_path / "kernel.cuh"
    lib = tmp_path / "hybrid_ep_cpp.so"
    src.write_text("template<int N> void k();")
    lib.write_bytes(b"x" * 10)
    base = build_identity([lib], [src], {"sm": "90"})
    assert base == build_identity([lib], [src], {"sm": "90"})
    assert base != build_identity([lib], [src], {"sm": "100"})
    src.write_text("template<int N> void k2();")
    changed_source = build_identity([lib], [src], {"sm": "90"})
    assert changed_source != base
    lib.write_bytes(b"x" * 11)
    assert build_identity([lib], [src], {"sm": "90"}) != changed_source


def test_the_process_folder_is_where_hybrid_ep_puts_it() -> None:
    assert hybrid_ep_process_folder(7, {}, "/home/u") == Path("/home/u/.deepep/hybrid_ep/jit/proc-7")
    assert hybrid_ep_process_folder(7, {"HYBRID_EP_CACHE_DIR": "/c"}, "/home/u") == Path(
        "/c/.deepep/hybrid_ep/jit/proc-7"
    )
    assert hybrid_ep_process_folder(7, {}, None) == Path("/tmp/.deepep/hybrid_ep/jit/proc-7")


_LIBRARY_LIKE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from moelab.backends.jit_cache import KernelStore, hybrid_ep_process_folder
    root, store = sys.argv[1], Path(sys.argv[2])
    kernels = KernelStore(store=store, process=hybrid_ep_process_folder(os.getpid(), {"HYBRID_EP_CACHE_DIR": root}, None))
    kernels.seed()
    kernel = kernels.process / "combine_8192_4096.so"
    if kernel.exists():
        print("reused", kernel.read_text())
    else:  # what the library's JIT does: build under a signature, then rename to the kernel key
        built = kernels.process / "combine_8192_4096-rank-0-node-0-99-c.so"
        built.write_text(f"built by {os.getpid()}")
        built.rename(kernel)
        print("compiled")
    kernels.harvest()
    """
)


def test_two_real_processes_compile_once(tmp_path: Path) -> None:
    script = tmp_path / "lib.py"
    script.write_text(_LIBRARY_LIKE)
    args = [sys.executable, str(script), str(tmp_path / "home"), str(tmp_path / "store")]
    env = {**os.environ, "PYTHONPATH": str(Path(moelab.__file__).parents[1])}
    first = subprocess.run(args, capture_output=True, text=True, check=True, env=env).stdout.strip()
    second = subprocess.run(args, capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert first == "compiled"
    assert second.startswith("reused built by ")
    assert len(list((tmp_path / "home" / ".deepep" / "hybrid_ep" / "jit").iterdir())) == 2  # one per pid


def test_kernel_cache_flag_resolution(tmp_path: Path) -> None:
    assert resolve_kernel_cache("off") is None
    auto = resolve_kernel_cache("auto")
    assert auto is not None and auto.endswith("kernels")
    assert resolve_kernel_cache(str(tmp_path / "k")) == str((tmp_path / "k").resolve())
    afile = tmp_path / "f"
    afile.write_text("")
    with pytest.raises(SpecError, match="not a folder"):
        resolve_kernel_cache(str(afile))


class _Buffer:
    made: list[dict[str, Any]] = []

    def __init__(self, **kw: Any) -> None:
        _Buffer.made.append(kw)


def _load_cached_signature(
    group: Any, hidden_dim: int, max_num_of_tokens_per_rank: int, num_local_experts: int,
    use_fp8: bool = False, num_sms_dispatch_api: int | None = None, num_sms_combine_api: int | None = None,
    load_cached_kernels: bool = False,
) -> None: ...  # fmt: skip


def _fake_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """hybrid_ep_cpp as the backend asks it once: a HandleImpl with every field moelab reads."""
    cpp = types.ModuleType("hybrid_ep_cpp")
    fields = dict.fromkeys(PlainHandle._fields + PermuteHandle._fields)
    cpp.HandleImpl = lambda: types.SimpleNamespace(**fields)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hybrid_ep_cpp", cpp)


def test_hybrid_ep_buffers_load_seeded_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend seeds its process folder from the store and asks the library to load it."""
    package = tmp_path / "deep_ep"
    (package / "backend").mkdir(parents=True)
    (package / "backend" / "hybrid_ep_backend.cuh").write_text("// kernels")
    fake = types.ModuleType("deep_ep")
    fake.__file__ = str(package / "__init__.py")
    _Buffer.__init__.__signature__ = __import__("inspect").signature(_load_cached_signature)  # type: ignore[attr-defined]
    fake.HybridEPBuffer = _Buffer  # type: ignore[attr-defined]
    monkeypatch.setattr(hybrid_ep_module.common, "import_deep_ep", lambda: (fake, None))
    _fake_extension(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv("HYBRID_EP_CACHE_DIR", str(tmp_path / "home"))
    ctx = BackendContext(
        rank=0, world=2, local_rank=0, device=torch.device("cuda", 0), group=None, gpus_per_node=2,
        comm_backend="nccl", kernel_cache=tmp_path / "cache",
    )  # fmt: skip
    monkeypatch.setattr(hybrid_ep_module, "hybrid_ep_reason", lambda shape, fused=False: None)
    case = CaseConfig(
        case_id="c", workload=Workload(hidden=512, tokens_per_rank=64, topk=2, experts_per_rank=4)
    )
    _Buffer.made.clear()
    backend = hybrid_ep_module.HybridEPBackend(ctx, [case])
    assert "load_cached_kernels" not in _Buffer.made[0]  # an empty store: nothing to load
    assert backend._kernels is not None
    backend._kernels.process.joinpath("k.so").write_bytes(b"compiled")  # what the first case compiled
    backend.close()
    _Buffer.made.clear()
    again = hybrid_ep_module.HybridEPBackend(ctx, [case])  # the same pid: the folder already has it
    assert _Buffer.made[0]["load_cached_kernels"] is True
    again.close()
    other = KernelStore(store=backend._kernels.store, process=tmp_path / "home" / "other")
    assert other.seed() == 1  # a new process would be seeded
    assert backend._kernels.store.parent == tmp_path / "cache" / "hybrid-ep"
    assert os.path.basename(backend.record(case)["kernel_store"]) == backend._kernels.store.name


def test_an_unwritable_store_costs_only_the_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--kernel-cache under a file (or on a read-only file system): the job runs and compiles its own."""
    package = tmp_path / "deep_ep"
    (package / "backend").mkdir(parents=True)
    fake = types.ModuleType("deep_ep")
    fake.__file__ = str(package / "__init__.py")
    fake.HybridEPBuffer = _Buffer  # type: ignore[attr-defined]
    monkeypatch.setattr(hybrid_ep_module.common, "import_deep_ep", lambda: (fake, None))
    _fake_extension(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(hybrid_ep_module, "hybrid_ep_reason", lambda shape, fused=False: None)
    monkeypatch.setenv("HYBRID_EP_CACHE_DIR", str(tmp_path / "home"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ctx = BackendContext(
        rank=0, world=2, local_rank=0, device=torch.device("cuda", 0), group=None, gpus_per_node=2,
        comm_backend="nccl", kernel_cache=blocker / "cache",
    )  # fmt: skip
    case = CaseConfig(
        case_id="c", workload=Workload(hidden=512, tokens_per_rank=64, topk=2, experts_per_rank=4)
    )
    backend = hybrid_ep_module.HybridEPBackend(ctx, [case])
    assert backend._kernels is not None
    backend._kernels.process.joinpath("k.so").write_bytes(b"compiled")
    backend.close()  # the harvest fails: said once, the store dropped, nothing raised
    out = capsys.readouterr().out
    assert "kernel store" in out and "unusable" in out and "compiles its own" in out
    assert backend.record(case)["kernel_store"] is None
