"""Compiled kernels kept across jobs for libraries that JIT-build them into a per-process folder.

Hybrid-EP builds each kernel configuration with nvcc on first use (about 13 s per SM count and payload
type on 2 ranks) into `<home>/.deepep/hybrid_ep/jit/proc-<pid>/<kernel key>.so`, a folder of its own per
process, so no later process ever finds them: every moelab job paid the compilation again. The library
can load what that folder already holds (`HybridEPBuffer(load_cached_kernels=True)` loads every `.so`
there when the buffer is made). moelab therefore keeps a store of its own, one folder per library build,
GPU and compiler, and

- `seed()` copies the store's kernels into this process's folder before the buffers are made;
- `harvest()` copies the kernels this process compiled back into the store (each file written under a
  temporary name and renamed into place, so two ranks harvesting the same key never leave a torn file).

The library's kernel key names the whole configuration it compiled for (hidden size, tokens, experts,
ranks per node, nodes, SM/block counts, fused or not). What the key leaves out, the library's own sources,
the compiler and the GPU, names the store folder (`build_identity`), so a rebuilt library or another GPU
starts an empty store rather than loading stale kernels.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

KERNEL_SUFFIX = ".so"


def _file_stamp(path: Path) -> str:
    """Path, size and modification time: what changes when a library is rebuilt or reinstalled."""
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def build_identity(
    binaries: Iterable[Path], sources: Iterable[Path], facts: Mapping[str, str], length: int = 16
) -> str:
    """A short hash naming one library build: its compiled extensions (by stamp), the sources its JIT
    compiles (by content) and plain facts such as the GPU's compute capability and the compiler."""
    h = hashlib.sha256()
    for path in sorted(binaries):
        h.update(_file_stamp(path).encode())
    for path in sorted(sources):
        h.update(str(path.name).encode())
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"missing")
    for key in sorted(facts):
        h.update(f"{key}={facts[key]}".encode())
    return h.hexdigest()[:length]


def _copy_atomically(src: Path, dest: Path) -> None:
    """`dest` appears whole or not at all, also when another process writes the same name at once."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def _kernels(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    # a kernel the library has not yet renamed to its key carries "-rank-" (its per-build signature)
    return sorted(
        p
        for p in folder.iterdir()
        if p.suffix == KERNEL_SUFFIX and not p.name.startswith(".") and "-rank-" not in p.name
    )


def _copy_missing(source: Path, dest: Path) -> int:
    """Copy the kernels of `source` that `dest` lacks into it (made if missing); returns how many."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for kernel in _kernels(source):
        target = dest / kernel.name
        if not target.exists():
            _copy_atomically(kernel, target)
            copied += 1
    return copied


@dataclass(frozen=True, slots=True)
class KernelStore:
    """moelab's store (`store`) for one library build, and this process's library JIT folder (`process`)."""

    store: Path
    process: Path

    def seed(self) -> int:
        """Copy the store's kernels that this process's folder lacks into it; returns how many."""
        return _copy_missing(self.store, self.process)

    def harvest(self) -> int:
        """Copy the kernels this process compiled (named by their final kernel key) into the store."""
        return _copy_missing(self.process, self.store)

    def cached(self) -> int:
        return len(_kernels(self.store))

    def loadable(self) -> int:
        """Kernels in this process's folder: what the library loads when asked to."""
        return len(_kernels(self.process))


def hybrid_ep_process_folder(pid: int, env: Mapping[str, str], home: str | None) -> Path:
    """Where Hybrid-EP's JIT puts this process's kernels (csrc/hybrid_ep/jit/compiler.cu `get_jit_dir`):
    $HYBRID_EP_CACHE_DIR, else the user's home, else /tmp; then .deepep/hybrid_ep/jit/proc-<pid>."""
    root = env.get("HYBRID_EP_CACHE_DIR") or home or "/tmp"
    return Path(root) / ".deepep" / "hybrid_ep" / "jit" / f"proc-{pid}"
