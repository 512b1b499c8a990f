"""The environment fingerprint stored with every run: who measured, on what, with which software."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import moelab

RECORDED_ENV_PREFIXES = (
    "NCCL_",
    "NVSHMEM_",
    "TORCH_NCCL_",
    "TORCH_SYMM",
    "CUDA_VISIBLE_DEVICES",
    "EP_",
    "UCX_",
)


def git_sha() -> str | None:
    """The moelab checkout's commit, when moelab runs from a git checkout."""
    root = Path(moelab.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def driver_version() -> str | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None


def fingerprint_host() -> str:
    return socket.gethostname()


def fingerprint(local_device: torch.device | None = None) -> dict[str, Any]:
    """This process's host and device facts (cheap; no kernels)."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "moelab_version": moelab.__version__,
        "moelab_git_sha": git_sha(),
        "gpu_name": None,
        "gpu_count": 0,
        "sm_count": None,
        "gpu_memory_gib": None,
        "driver": None,
        "nccl": None,
        "env_vars": {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)},
        "argv0": sys.argv[0] if sys.argv else None,
    }
    if torch.cuda.is_available():
        dev = (
            local_device
            if local_device is not None and local_device.type == "cuda"
            else torch.device("cuda", 0)
        )
        props = torch.cuda.get_device_properties(dev)
        env.update(
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            sm_count=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            driver=driver_version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            gpu_capability=f"{props.major}.{props.minor}",
        )
    return env
