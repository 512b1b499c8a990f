"""`uccl-ep`: UCCL-EP (PyPI `uccl`, `uccl.ep`) through its DeepEP-compatible wrapper, driven as `deepep`.

UCCL-EP runs DeepEP's kernels with its own CPU proxies for the network path. The PyPI wheel (uccl 0.1.1)
ships only the compiled runtime `uccl.ep` (built against CUDA 12: it needs libcudart.so.12, and
libibverbs.so.1); the `deep_ep.Buffer` API that moelab drives comes from the wrapper in the UCCL repository
(`ep/deep_ep_wrapper`, a package named `deep_ep` over `uccl.ep`), which is not on PyPI. Point the job at
it: `--backend-path uccl-ep=<uccl>/ep/deep_ep_wrapper`. Knobs, SM control and rules are deepep's.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from pathlib import Path

from moelab.backends import deepep_common as common
from moelab.backends.base import BackendContext, CaseConfig
from moelab.backends.deepep import DeepEPBackend
from moelab.core.errors import BackendUnavailable

PACKAGE = "uccl==0.1.1"
WRAPPER_HINT = "UCCL's DeepEP wrapper (ep/deep_ep_wrapper in github.com/uccl-project/uccl) is not on the path"
WRAPPER_MARK = "uccl"
CUDART12 = "libcudart.so.12"
CUDART12_HINT = "pip install nvidia-cuda-runtime-cu12 supplies it"


def import_problem(exc: BaseException) -> str:
    """One line naming what failed to load, from an ImportError/OSError of `import uccl.ep`."""
    name = getattr(exc, "name", None)
    if name == "uccl":
        return f"uccl not installed (pip install {PACKAGE})"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    hint = f" ({CUDART12_HINT})" if CUDART12 in text and find_cudart12() is None else ""
    return f"import uccl.ep failed: {text}{hint}"


def find_cudart12(paths: Sequence[str] | None = None) -> Path | None:
    """libcudart.so.12 of an installed nvidia-cuda-runtime-cu12 wheel, on `paths` (default sys.path)."""
    for entry in sys.path if paths is None else paths:
        lib = Path(entry or ".") / "nvidia" / "cuda_runtime" / "lib" / CUDART12
        if lib.is_file():
            return lib
    return None


def _uccl_problem() -> str | None:
    """None when uccl.ep imports. The wheel finds libcudart.so.12 only on the loader's path; a CUDA 13
    image has none, so a cu12 runtime wheel's copy is loaded first (by soname) and the import retried."""
    try:
        import uccl.ep  # noqa: F401
    except (ImportError, OSError) as exc:
        lib = find_cudart12()
        if CUDART12 not in str(exc) or lib is None:
            return import_problem(exc)
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        try:
            import uccl.ep  # noqa: F401,F811
        except (ImportError, OSError) as retry:
            return f"{import_problem(retry)} (after loading {lib})"
    return None


def wrapper_problem(origin: str | None) -> str | None:
    """None when `origin` (where `deep_ep` imports from) is UCCL's wrapper, else why not."""
    if origin is None:
        return f"{WRAPPER_HINT} (no deep_ep found): pass --backend-path uccl-ep=<uccl>/ep/deep_ep_wrapper"
    package = Path(origin).parent
    buffer = package / "buffer.py"
    text = buffer.read_text(errors="replace") if buffer.is_file() else ""
    if WRAPPER_MARK not in text:
        return f"{WRAPPER_HINT}: deep_ep at {package} is DeepEP itself, not UCCL's wrapper"
    return None


class UcclEPBackend(DeepEPBackend):
    name = "uccl-ep"
    description = "UCCL-EP (uccl.ep) through its DeepEP-compatible deep_ep wrapper, normal kernels"
    library_test = None  # DeepEP's tests run DeepEP itself, not the wrapper
    tuning = None  # not among the backends `moelab tune` searches by default
    dispatch_family_source = (
        "uccl-project/uccl ep/README.md (9ef7dfd, 2026-08-17): 'the same interface and functionality as DeepEP'; "
        "its normal kernels are tabled as 'Normal kernels with NVLink and RDMA forwarding' (hierarchical)"
    )
    source_build = None  # the wrapper is Python; uccl itself is installed, not given as a tree
    column_unit = 0  # its combine on a column slice is unchecked: mode columns is unsupported

    @classmethod
    def availability(cls) -> str | None:
        problem = _uccl_problem() or wrapper_problem(common.find_spec_origin("deep_ep"))
        if problem:
            return problem
        return super().availability()

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        problem = _uccl_problem() or wrapper_problem(common.find_spec_origin("deep_ep"))
        if problem:
            raise BackendUnavailable(problem)
        super().__init__(ctx, cases)

    def library_versions(self) -> dict[str, str]:
        versions = super().library_versions()
        try:
            from importlib.metadata import version

            versions["uccl"] = version("uccl")
        except Exception:
            pass
        return versions
