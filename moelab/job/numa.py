"""`--bind numa`: pin a rank to the CPUs (and prefer the memory) of its GPU's NUMA node, and say what was done.

Azure's post "Achieving Optimal Performance for DeepSeek Expert Parallelism (DeepEP) on Azure" (Azure HPC
blog) binds by hand (rank // 4 → node, psutil + libnuma); here the node and CPU
set come from the GPU itself: NVML's CPU affinity and NUMA node, or the PCI function's sysfs `local_cpulist`
and `numa_node`. Call it early in the rank's main thread, before libraries start their own threads: the
memory policy is per thread and inherited by threads created afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab.core.errors import MoelabError
from moelab.job.sysfs import format_cpulist, normalize_bus_id, parse_cpulist, pci_numa

_DEFAULT = object()


@dataclass(frozen=True, kw_only=True, slots=True)
class NumaBinding:
    """Where a GPU sits: its NUMA node and the CPUs local to it."""

    gpu: int
    pci_bus_id: str | None
    numa_node: int | None
    cpulist: str
    source: str  # "nvml", "sysfs" or "nvml+sysfs"


@dataclass(frozen=True, kw_only=True, slots=True)
class AppliedBinding:
    """What `apply_binding` changed, recorded with the run."""

    gpu: int
    pci_bus_id: str | None
    numa_node: int | None
    source: str
    previous_cpulist: str
    cpulist: str
    memory_policy: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cuda_uuid(ordinal: int) -> str:
    """The NVML-style UUID ("GPU-…") of a CUDA ordinal, which honours CUDA_VISIBLE_DEVICES where NVML does not."""
    import torch

    uuid = str(torch.cuda.get_device_properties(ordinal).uuid)
    return uuid if uuid.upper().startswith("GPU-") else f"GPU-{uuid}"


def _nvml_facts(
    nvml: Any, gpu: int, uuid: str | None, num_cpus: int
) -> tuple[str | None, int | None, str | None]:
    error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    nvml.nvmlInit()
    try:
        h = nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(gpu)
        busid = nvml.nvmlDeviceGetPciInfo(h).busId
        bus_id = normalize_bus_id(busid.decode() if isinstance(busid, bytes) else str(busid))
        words = max(1, (num_cpus + 63) // 64)
        try:
            mask = nvml.nvmlDeviceGetCpuAffinityWithinScope(h, words, nvml.NVML_AFFINITY_SCOPE_NODE)
        except (error_type, AttributeError):
            mask = nvml.nvmlDeviceGetCpuAffinity(h, words)
        cpus = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
        try:
            node: int | None = int(nvml.nvmlDeviceGetNumaNodeId(h))
        except (error_type, AttributeError):
            node = None
        return bus_id, node, format_cpulist(cpus) if cpus else None
    finally:
        nvml.nvmlShutdown()


def resolve_binding(
    gpu: int,
    *,
    uuid: str | None = None,
    pci_bus_id: str | None = None,
    nvml: Any = _DEFAULT,
    sysfs_root: str | Path = "/",
    num_cpus: int | None = None,
) -> NumaBinding:
    """The NUMA node and CPU set of local GPU `gpu` (an NVML index, or found by `uuid` / `pci_bus_id`).
    NVML first; sysfs fills what NVML lacks, and stands alone when NVML is missing but the bus id is known."""
    sources = []
    node: int | None = None
    cpulist: str | None = None
    nvml_error = None
    if nvml is _DEFAULT:
        try:
            nvml = importlib.import_module("pynvml")  # nvidia-ml-py
        except ImportError:
            nvml, nvml_error = None, "nvidia-ml-py is not installed"
    if nvml is not None:
        try:
            bus, node, cpulist = _nvml_facts(nvml, gpu, uuid, num_cpus or os.cpu_count() or 1)
            pci_bus_id = pci_bus_id or bus
            sources.append("nvml")
        except Exception as exc:  # NVML missing its driver, unknown UUID: fall back to sysfs
            nvml_error = f"{type(exc).__name__}: {exc}"
    if pci_bus_id is not None and (node is None or cpulist is None):
        s_node, s_cpus = pci_numa(sysfs_root, pci_bus_id)
        if s_node is not None or s_cpus:
            sources.append("sysfs")
        node = node if node is not None else s_node
        cpulist = cpulist or s_cpus
    if not cpulist:
        why = nvml_error or "neither NVML nor sysfs gave its local CPUs"
        raise MoelabError(f"--bind numa: cannot find GPU {gpu}'s NUMA CPUs ({why})")
    return NumaBinding(
        gpu=gpu, pci_bus_id=pci_bus_id, numa_node=node, cpulist=cpulist, source="+".join(sources)
    )


def libnuma_prefer(node: int) -> str:
    """Prefer allocating memory on `node` (libnuma numa_set_preferred, as Azure's DeepEP post does); says what happened."""
    name = ctypes.util.find_library("numa")
    if name is None:
        return "not applied: libnuma not found"
    lib = ctypes.CDLL(name)
    if lib.numa_available() == -1:
        return "not applied: libnuma says NUMA is unavailable"
    lib.numa_set_preferred.argtypes = [ctypes.c_int]
    lib.numa_set_preferred(node)
    return f"preferred node {node} (libnuma numa_set_preferred)"


def set_process_affinity(pid: int, cpus: Iterable[int]) -> None:
    """os.sched_setaffinity binds one thread; bind every thread of this process (as `taskset -a` does), so
    threads the CUDA runtime or torch started before the binding follow it too."""
    cpus = set(cpus)
    tasks = Path("/proc/self/task")
    tids = [int(t) for t in os.listdir(tasks)] if pid == 0 and tasks.is_dir() else [pid]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def apply_binding(
    binding: NumaBinding,
    *,
    get_affinity: Callable[[int], Iterable[int]] = os.sched_getaffinity,
    set_affinity: Callable[[int, Iterable[int]], None] = set_process_affinity,
    set_memory_node: Callable[[int], str] | None = libnuma_prefer,
) -> AppliedBinding:
    """Pin this process (all its threads) to the GPU's CPUs that it is allowed to use (a cgroup or SLURM may
    allow fewer), and prefer the GPU's NUMA node for this thread's memory (inherited by later threads)."""
    allowed = set(get_affinity(0))
    want = set(parse_cpulist(binding.cpulist)) & allowed
    if not want:
        raise MoelabError(
            f"--bind numa: GPU {binding.gpu}'s CPUs ({binding.cpulist}) are all outside this process's allowed CPUs ({format_cpulist(allowed)})"
        )
    set_affinity(0, want)
    if binding.numa_node is None:
        memory = "not applied: NUMA node unknown"
    elif set_memory_node is None:
        memory = "not applied: memory binding off"
    else:
        memory = set_memory_node(binding.numa_node)
    return AppliedBinding(
        gpu=binding.gpu,
        pci_bus_id=binding.pci_bus_id,
        numa_node=binding.numa_node,
        source=binding.source,
        previous_cpulist=format_cpulist(allowed),
        cpulist=format_cpulist(want),
        memory_policy=memory,
    )
