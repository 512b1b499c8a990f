"""What the DeepEP-family backends share: finding deep_ep and what it offers, versions, the fp8 cast of
DeepEP's tests, the libraries' own bandwidth figures, and a small cache for work done once per input.

Nothing here imports deep_ep at module import: `moelab backends` lists these backends on hosts without it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moelab.backends.base import BackendContext, CaseConfig, Placement, SourceBuild
from moelab.backends.deepep_rules import Shape

BUILD_HINT = (
    "build DeepEP from source (github.com/deepseek-ai/DeepEP, tag v1.2.1 or branch hybrid-ep: "
    "`python setup.py build_ext --inplace`) and put it on PYTHONPATH"
)
# DeepEP's source tree (tag v1.2.1, branch hybrid-ep, or V2): `build_ext --inplace` puts deep_ep_cpp (V1,
# hybrid-ep) beside setup.py, or the V2 extension in deep_ep/
SOURCE_BUILD = SourceBuild(
    package="deep_ep",
    built=("deep_ep_cpp*.so", "deep_ep/_C*.so"),
    step="python setup.py build_ext --inplace",
)
FP8_BLOCK = 128
FP8_MAX = 448.0


def find_spec_origin(name: str) -> str | None:
    """Where module `name` would be imported from, without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin or (next(iter(spec.submodule_search_locations or []), None))


def cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU (DeepEP kernels run on NVIDIA GPUs only)"
    major, _ = torch.cuda.get_device_capability(0)
    if major < 8:
        return f"GPU compute capability {major}.x: DeepEP needs SM80 or newer (SM90 for fp8 and TMA)"
    return None


def import_deep_ep() -> tuple[Any, str | None]:
    """(module, None) or (None, one-line reason). Importing loads the C++ extension(s), so only call it
    where that is acceptable (availability() after the cheap checks, and inside the job)."""
    if find_spec_origin("deep_ep") is None:
        return None, f"deep_ep not installed ({BUILD_HINT})"
    try:
        return importlib.import_module("deep_ep"), None
    except ImportError as exc:
        return None, f"deep_ep fails to import: {exc}".splitlines()[0]
    except Exception as exc:  # the V2 package asserts on NCCL mismatches at import
        return None, f"deep_ep fails to import: {type(exc).__name__}: {exc}".splitlines()[0]


def api_of(deep_ep: Any) -> str:
    """Which API the installed deep_ep offers: "v2" (ElasticBuffer), "v1+hybrid" (HybridEPBuffer), or "v1"."""
    if hasattr(deep_ep, "ElasticBuffer"):
        return "v2"
    if hasattr(deep_ep, "HybridEPBuffer"):
        return "v1+hybrid"
    return "v1"


def extension_paths(names: Sequence[str] = ("deep_ep_cpp", "hybrid_ep_cpp", "deep_ep._C")) -> dict[str, str]:
    """Files of the compiled extensions that would be loaded (absent ones are left out)."""
    out = {}
    for name in names:
        origin = find_spec_origin(name)
        if origin:
            out[name] = origin
    return out


def libstdcxx_diagnosis(so_path: str, run: Callable[[list[str]], str] | None = None) -> str | None:
    """A warning when a C++ extension links no libstdc++ (the crash of DeepEP branch hybrid-ep built with the
    image's /opt/gcc g++ wrapper: segfault in HybridEPBuffer() at get_comm_id -> std::ostream::operator<<)."""
    if not so_path.endswith(".so"):
        return None
    if run is None:
        if shutil.which("ldd") is None:
            return None

        def run(cmd: list[str]) -> str:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout

    text = run(["ldd", so_path])
    if not text.strip() or "libstdc++" in text:
        return None
    return (
        f"{Path(so_path).name} links no libstdc++ (ldd): built by a g++ wrapper that links C++ statically or not at all; "
        "it can segfault in its constructor. Rebuild with CXX=/usr/bin/g++ CC=/usr/bin/gcc LDSHARED='/usr/bin/g++ -shared'"
    )


def deep_ep_versions(deep_ep: Any, api: str) -> dict[str, str]:
    """Version, commit and location of the deep_ep in use, for the run's provenance."""
    out: dict[str, str] = {
        "deep_ep_api": {
            "v2": "V2 ElasticBuffer",
            "v1+hybrid": "V1 Buffer + HybridEPBuffer",
            "v1": "V1 Buffer",
        }[api]
    }
    version = getattr(deep_ep, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version("deep_ep")
        except importlib.metadata.PackageNotFoundError:
            version = None
    if version:
        out["deep_ep"] = str(version)
    module_file = getattr(deep_ep, "__file__", None)
    if module_file:
        root = Path(module_file).resolve().parent.parent
        out["deep_ep_path"] = str(root)
        sha = git_sha_near(root)
        if sha:
            out["deep_ep_commit"] = sha
    for name, path in extension_paths().items():
        out[f"{name}_so"] = path
    return out


def git_sha_near(root: Path) -> str | None:
    """The commit of a source checkout or archive: a `.git` HEAD, a COMMIT/REVISION file the build left, or
    the `git archive` pax header comment (tar keeps it only in the archive, so that is rarely present)."""
    for name in ("COMMIT", "REVISION", ".commit", "GIT_SHA"):
        path = root / name
        if path.is_file():
            text = path.read_text().strip()
            if re.fullmatch(r"[0-9a-f]{7,40}", text):
                return text
    head = root / ".git" / "HEAD"
    if head.is_file():
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            target = root / ".git" / ref[5:]
            if target.is_file():
                return target.read_text().strip()
            return None
        return ref
    return None


def shape_of(ctx: BackendContext | Placement, case: CaseConfig, sm90_features: bool = True) -> Shape:
    wl = case.workload
    return Shape(
        hidden=wl.hidden,
        topk=wl.topk,
        tokens_per_rank=wl.tokens_per_rank,
        experts_per_rank=wl.experts_per_rank,
        dtype=wl.dtype,
        world=ctx.world,
        gpus_per_node=ctx.gpus_per_node,
        sms=case.sms,
        sm90_features=sm90_features,
    )


def per_token_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepEP tests/utils.py per_token_cast_to_fp8: e4m3 with one float32 scale per 1x128 block (amax/448)."""
    assert x.dim() == 2 and x.size(1) % FP8_BLOCK == 0
    m, n = x.shape
    x_view = x.view(m, -1, FP8_BLOCK)
    x_amax = x_view.abs().float().amax(dim=2).view(m, -1).clamp(1e-4)
    x_fp8 = (x_view * (FP8_MAX / x_amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, n)
    return x_fp8, (x_amax / FP8_MAX).view(m, -1)


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryFigure:
    """A bandwidth computed the way a library's own test prints it."""

    definition: str
    gbps: float
    time_us: float
    bytes: float


def hybrid_ep_figure(rank0_bytes: float, per_rank_time_us: Sequence[float]) -> LibraryFigure:
    """Hybrid-EP tests/test_hybrid_ep.py `_report_bw`: rank 0's bytes over the MEAN of the ranks' times
    (each rank's time being its own average over the bench iterations); NVL bytes = `dispatched_hidden.numel() * 2`
    (x (1 + 4/128)/2 for fp8), combine the same count."""
    if not per_rank_time_us:
        raise ValueError("hybrid_ep_figure needs at least one rank's time")
    t_avg = sum(per_rank_time_us) / len(per_rank_time_us)
    return LibraryFigure(
        definition="hybrid_ep_rank0_bytes_over_mean_time",
        gbps=rank0_bytes / 1e9 / (t_avg * 1e-6),
        time_us=t_avg,
        bytes=rank0_bytes,
    )


def deepep_bench_time_us(samples_us: Sequence[float]) -> float:
    """DeepEP tests/utils.py `bench`: the average of the timed iterations after dropping the first."""
    kept = list(samples_us[1:]) if len(samples_us) > 1 else list(samples_us)
    return sum(kept) / len(kept)
