"""Take a node's health snapshot, and compare two of them to see what went wrong during a run.

`take_snapshot()` never fails for lack of hardware: with no GPU, no NVML or no InfiniBand it returns a snapshot
that says what was not available. `diff(before, after)` lists the findings that appeared between two snapshots
(new throttling, new ECC errors, links gone down, counters that moved); any warn or fail among them marks the
run's results `suspect`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from moelab.core.errors import MoelabError
from moelab.health import rules
from moelab.health.model import STATUS_RANK, Finding, GpuPair, GpuState, HealthSnapshot, NicState, Status
from moelab.health.nvml_probe import LoadFn, probe_nvml, torch_matmul_load
from moelab.health.sysfs_probe import (
    LspciRunner,
    ib_devices,
    numa_nodes,
    process_cpulist,
    run_lspci,
    with_pci_facts,
)
from moelab.job.sysfs import pci_numa

_DEFAULT = object()


def _import_pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def take_snapshot(
    *,
    nvml: Any = _DEFAULT,
    sysfs_root: str | Path = "/",
    lspci: LspciRunner | None = run_lspci,
    load_ms: float = 0.0,
    load: LoadFn | None = torch_matmul_load,
    host: str | None = None,
    local_gpu: int | None = None,
    num_cpus: int | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> HealthSnapshot:
    """Probe this node. `nvml` defaults to the real pynvml (None: skip NVML); `lspci=None` skips lspci;
    `load_ms > 0` runs `load` on each GPU to read clocks under load; `local_gpu` is the rank's NVML index."""
    unavailable: dict[str, str] = {}
    if nvml is _DEFAULT:
        try:
            nvml = _import_pynvml()
        except ImportError:
            nvml = None
            unavailable["nvml"] = "nvidia-ml-py is not installed (pip install 'moelab[nvml]')"
    elif nvml is None:
        unavailable["nvml"] = "NVML probing turned off"
    gpus: tuple[GpuState, ...] = ()
    pairs: tuple[GpuPair, ...] = ()
    driver = cuda = None
    nvml_ok = False
    if nvml is not None:
        report = probe_nvml(
            nvml,
            num_cpus=num_cpus or os.cpu_count() or 1,
            load=load if load_ms > 0 else None,
            load_ms=load_ms,
        )
        unavailable.update(report.unavailable or {})
        nvml_ok, driver, cuda, pairs = (
            report.available,
            report.driver_version,
            report.cuda_driver_version,
            report.pairs,
        )
        gpus = tuple(_fill_numa_from_sysfs(g, sysfs_root) for g in report.gpus)
    nics = _nics(sysfs_root, lspci, unavailable)
    return HealthSnapshot(
        host=host or socket.gethostname(),
        taken_at=now().isoformat(timespec="seconds"),
        nvml_available=nvml_ok,
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=gpus,
        gpu_pairs=pairs,
        nics=nics,
        numa_nodes=numa_nodes(sysfs_root),
        process_cpulist=process_cpulist(),
        local_gpu=local_gpu,
        unavailable=unavailable,
    )


def _nics(
    sysfs_root: str | Path, lspci: LspciRunner | None, unavailable: dict[str, str]
) -> tuple[NicState, ...]:
    """The node's InfiniBand/RDMA devices, with lspci's PCI facts where lspci runs."""
    nics = ib_devices(sysfs_root)
    if not nics:
        unavailable["nics"] = "no InfiniBand/RDMA devices under /sys/class/infiniband"
    elif lspci is not None:
        bus_ids = [n.pci_bus_id for n in nics if n.pci_bus_id]
        try:
            nics = with_pci_facts(nics, lspci(bus_ids))
        except (OSError, ValueError) as exc:
            unavailable["lspci"] = str(exc)
    return nics


def take_snapshot_subprocess(
    *, load_ms: float = 300.0, timeout_s: float = 120.0, python: str = sys.executable
) -> HealthSnapshot:
    """take_snapshot in a child process (`python -m moelab.health`): the launcher keeps no CUDA context on the
    GPUs its jobs use, and a GPU that hangs the probe costs `timeout_s`, not the run. On a timeout or a crash
    the snapshot says so in `unavailable` rather than raising."""
    argv = [python, "-m", "moelab.health", "--load-ms", str(load_ms)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _failed_snapshot(f"health probe timed out after {timeout_s:.0f} s")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return _failed_snapshot(f"health probe exited {proc.returncode}: {tail}")
    return loads(proc.stdout.strip().splitlines()[-1])


def _failed_snapshot(reason: str) -> HealthSnapshot:
    return HealthSnapshot(
        host=socket.gethostname(),
        taken_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        unavailable={"probe": reason},
    )


def _fill_numa_from_sysfs(g: GpuState, root: str | Path) -> GpuState:
    """NVML's NUMA node call is missing on many x86 drivers; the PCI function's sysfs entry has it."""
    if g.pci_bus_id is None or (g.numa_node is not None and g.cpulist is not None):
        return g
    node, cpulist = pci_numa(root, g.pci_bus_id)
    return dataclasses.replace(
        g, numa_node=g.numa_node if g.numa_node is not None else node, cpulist=g.cpulist or cpulist
    )


# ---- before/after ------------------------------------------------------------------------------------------

SRC_DIFF = "moelab health diff: before vs after the backend job"


def _counter_findings(host: str, b: GpuState, a: GpuState) -> list[Finding]:
    out = []

    def grew(name: str) -> int:
        x, y = getattr(b, name), getattr(a, name)
        return (y - x) if x is not None and y is not None and y > x else 0

    def add(check: str, status: Status, reason: str) -> None:
        out.append(
            Finding(host=host, subject=a.label, check=check, status=status, reason=reason, source=SRC_DIFF)
        )

    if d := grew("thermal_violation_ns"):
        add(
            "thermal_violation",
            "warn",
            f"clocks held down for thermal reasons {d / 1e6:.1f} ms during the run (NVML violation counter)",
        )
    if d := grew("power_violation_ns"):
        add("power_violation", "info", f"clocks held at the power limit {d / 1e6:.1f} ms during the run")
    if d := grew("ecc_volatile_uncorrected"):
        add("ecc_during_run", "fail", f"{d} new uncorrectable ECC errors during the run")
    if d := grew("ecc_volatile_corrected"):
        add("ecc_during_run", "warn", f"{d} new corrected ECC errors during the run")
    if d := grew("pcie_replay_count"):
        add("pcie_replays", "warn", f"{d} PCIe replays during the run")
    if (d := grew("retired_pages_sbe") + grew("retired_pages_dbe")) > 0:
        add("retired_pages_during_run", "warn", f"{d} pages retired during the run")
    if b.nvlinks_active > a.nvlinks_active:
        add(
            "nvlink_during_run",
            "fail",
            f"NVLink links up fell from {b.nvlinks_active} to {a.nvlinks_active} during the run",
        )
    return out


def diff(before: HealthSnapshot, after: HealthSnapshot) -> list[Finding]:
    """Findings that appeared or worsened between two snapshots of one node, plus counters that moved.
    GPUs are matched by UUID (by index where NVML gave no UUID)."""
    was = {f.key: f for f in rules.evaluate(before)}
    out = []
    for f in rules.evaluate(after):
        prev = was.get(f.key)
        if STATUS_RANK[f.status] >= 1 and (prev is None or STATUS_RANK[prev.status] < STATUS_RANK[f.status]):
            out.append(
                Finding(
                    host=f.host,
                    subject=f.subject,
                    check=f.check,
                    status=f.status,
                    reason="appeared during the run: " + f.reason,
                    source=f.source,
                )
            )

    def key(g: GpuState) -> str:
        return g.uuid or f"index{g.index}"

    by_key = {key(g): g for g in before.gpus}
    for g in after.gpus:
        if key(g) in by_key:
            out += _counter_findings(after.host, by_key[key(g)], g)
    return out


def require_healthy(snap: HealthSnapshot) -> list[Finding]:
    """`--require-healthy`: raise a one-line MoelabError naming the failing checks; else return the findings."""
    findings = rules.evaluate(snap)
    failing = [f for f in findings if f.status == "fail"]
    if failing:
        what = "; ".join(f"{f.subject} {f.check}: {f.reason}" for f in failing[:3])
        more = f" (+{len(failing) - 3} more)" if len(failing) > 3 else ""
        raise MoelabError(f"{snap.host} is not healthy: {what}{more}; see `moelab doctor`")
    return findings


def is_suspect(findings: Sequence[Finding]) -> bool:
    """A run is suspect when anything at warn or worse appeared during it."""
    return any(STATUS_RANK[f.status] >= 1 for f in findings)


# ---- many nodes, JSON --------------------------------------------------------------------------------------


def load_snapshots(data: Any) -> list[HealthSnapshot]:
    """One snapshot dict, a list of them, or a doctor report {"nodes": [...]} → snapshots."""
    if isinstance(data, dict) and "nodes" in data:
        data = data["nodes"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ValueError("expected a health snapshot, a list of them, or a doctor report")
    if not data:  # judged, no node would be a pass over 0 nodes
        raise ValueError("it holds no snapshot")
    return [HealthSnapshot.from_dict(d) for d in data]


def merge(snaps: Sequence[HealthSnapshot]) -> dict[str, Any]:
    """Many nodes' snapshots → one report: each node's findings, the cross-node findings (outliers, mixed
    hardware) apart, and the worst status over both. A report is JSON and `load_snapshots` reads it back."""
    findings = [f for s in snaps for f in rules.evaluate(s)]
    cluster = rules.compare_nodes(snaps)
    return {
        "worst": rules.worst(findings + cluster),
        "nodes": [s.to_dict() for s in snaps],
        "findings": [f.to_dict() for f in findings],
        "cluster": [f.to_dict() for f in cluster],
    }


def dumps(snap: HealthSnapshot) -> str:
    return json.dumps(snap.to_dict(), sort_keys=True)


def loads(text: str) -> HealthSnapshot:
    return HealthSnapshot.from_dict(json.loads(text))
