"""Probe the EP libraries moelab can drive beyond DeepEP: what loads on this host and, where not, the exact error.

Prints, one block per library: torch symmetric memory (all_to_all_vdev, NVSHMEM), NCCL EP (`import nccl.ep`,
the libnccl it found, the one torch loaded) and UCCL-EP (`import uccl.ep`, its unresolved shared libraries),
then `moelab backends`' verdict for torch-symm-a2a, nccl-ep and uccl-ep. Single process, no GPU kernels.

    PYTHONPATH=/tmp/site:$PYTHONPATH python3 benchmarks/probe_ep_libs.py
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import torch


def _loaded(pattern: str) -> list[str]:
    """Shared objects matching `pattern` mapped into this process."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps if pattern in line and "/" in line})


def _try(label: str, module: str) -> object | None:
    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # the bindings raise RuntimeError, OSError, ImportError
        print(f"{label}: import {module} FAILED: {type(exc).__name__}: {exc}")
        print("  " + "  ".join(traceback.format_exception_only(type(exc), exc)).strip())
        return None
    print(f"{label}: import {module} ok ({getattr(mod, '__file__', None)})")
    return mod


def _unresolved(so: Path) -> list[str]:
    if not shutil.which("ldd") or not so.is_file():
        return []
    done = subprocess.run(["ldd", str(so)], capture_output=True, text=True, check=False)
    return [line.strip() for line in done.stdout.splitlines() if "not found" in line]


def probe_symm_mem() -> None:
    print("== torch symmetric memory")
    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, GPUs {torch.cuda.device_count()}")
    symm = _try("symm_mem", "torch.distributed._symmetric_memory")
    if symm is None:
        return
    op = getattr(torch.ops.symm_mem, "all_to_all_vdev", None)
    print(f"all_to_all_vdev: {op.default._schema if op is not None else 'absent'}")
    op2 = getattr(torch.ops.symm_mem, "all_to_all_vdev_2d", None)
    print(f"all_to_all_vdev_2d: {op2.default._schema if op2 is not None else 'absent'}")
    print(f"is_nvshmem_available: {symm.is_nvshmem_available()}")  # type: ignore[attr-defined]
    print(f"libnvshmem loaded: {_loaded('nvshmem')}")


def probe_nccl_ep() -> None:
    print("== NCCL EP (nccl-extensions)")
    if torch.cuda.is_available():
        print(f"torch NCCL: {'.'.join(map(str, torch.cuda.nccl.version()))}")
    print(f"libnccl loaded before nccl.ep: {_loaded('libnccl')}")
    _try("cuda.bindings", "cuda.bindings")
    core = _try("nccl4py", "nccl.core")
    ep = _try("nccl-extensions", "nccl.ep")
    if core is not None:
        try:
            print(f"nccl.core.get_version(): {core.get_version()}")  # type: ignore[attr-defined]
        except BaseException as exc:
            print(f"nccl.core.get_version() FAILED: {type(exc).__name__}: {exc}")
    if ep is not None:
        for fn in ("get_lib_version", "get_lib_path"):
            try:
                print(f"nccl.ep.{fn}(): {getattr(ep, fn)()}")
            except BaseException as exc:
                print(f"nccl.ep.{fn}() FAILED: {type(exc).__name__}: {exc}")
    print(f"libnccl loaded after: {_loaded('libnccl')}")


def probe_uccl() -> None:
    print("== UCCL-EP (uccl)")
    spec = importlib.util.find_spec("uccl")
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(next(iter(spec.submodule_search_locations)))
        for so in sorted(pkg.glob("ep*.so")):
            # libtorch/libc10 resolve by soname once torch is imported; the rest must come from the loader path
            missing = [m for m in _unresolved(so) if not m.startswith(("libtorch", "libc10"))]
            print(f"{so.name} unresolved (besides torch's own): {missing or 'none'}")
    _try("uccl", "uccl.ep")
    _try("deep_ep (UCCL's wrapper?)", "deep_ep")


def main() -> None:
    probe_symm_mem()
    probe_nccl_ep()
    probe_uccl()
    print("== moelab backends")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's moelab
    from moelab.backends import registry
    from moelab.backends.uccl_ep import find_cudart12

    print(f"libcudart.so.12 from nvidia-cuda-runtime-cu12: {find_cudart12()}")
    for name in ("torch-symm-a2a", "nccl-ep", "uccl-ep"):
        print(f"{name}: {registry.availability(name) or 'available'}")


if __name__ == "__main__":
    main()
