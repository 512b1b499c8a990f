"""Pure rules: a snapshot (or several nodes' snapshots) in, pass/info/warn/fail findings out, each with its source.

pass and info are healthy (info says what could not be checked or is worth knowing); warn is a number that may
be off; fail means do not benchmark here. Every finding names the rule's origin so a reader can check it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from moelab.health.model import Finding, GpuState, HealthSnapshot, NicState, Status, worst_status
from moelab.job.sysfs import parse_cpulist

THROTTLE_FRACTION = 0.75
"""NVBench's default `--throttle-threshold`: a clock under load below 75% of the default SM clock is throttled."""

OUTLIER_FRACTION = 0.95
"""Across GPUs/nodes: a loaded clock this far below the median names its GPU as the pace setter."""

SRC_NVBENCH = "NVBench measure_cold: throttled when SM clock < 0.75 × default SM clock (cudaDevAttrClockRate = NVML max SM clock)"
SRC_NVML_REASONS = "NVML nvmlDeviceGetCurrentClocksEventReasons (nvmlClocksEventReasons*)"
SRC_NVML_ECC = "NVML nvmlDeviceGetTotalEccErrors; NVIDIA GPU memory error management"
SRC_NVML_REMAP = "NVML nvmlDeviceGetRemappedRows; NVIDIA GPU memory error management (row remapping)"
SRC_NVML_PAGES = "NVML nvmlDeviceGetRetiredPages / nvmlDeviceGetRetiredPagesPendingStatus"
SRC_NVML_PCIE = "NVML nvmlDeviceGetCurrPcieLink* vs nvmlDeviceGetMaxPcieLink*"
SRC_NVML_NVLINK = "NVML nvmlDeviceGetNvLinkState"
SRC_TOPOLOGY = (
    "NVML nvmlDeviceGetP2PStatus(NVLINK) / nvmlDeviceGetTopologyCommonAncestor; `nvidia-smi topo -m` (NV# between "
    "SXM GPUs, PIX/NODE/SYS over PCIe): docs.nvidia.com/deploy/nvidia-smi"
)
SRC_ATOMICS = (
    "lspci -vvv AtomicOpsCap/AtomicOpsCtl; NVSHMEM Installation Guide, hardware requirements (atomics need NVLink or "
    "GPUDirect RDMA): docs.nvidia.com/nvshmem/release-notes-install-guide/install-guide/abstract.html"
)
SRC_IB = "/sys/class/infiniband/*/ports/*/{state,phys_state,rate}"
SRC_NUMA = (
    "sysfs numa_node of GPU and NIC PCI functions; Azure HPC blog, 'Achieving Optimal Performance for DeepSeek "
    "Expert Parallelism (DeepEP) on Azure' (2025-05-16): techcommunity.microsoft.com/blog/"
    "azurehighperformancecomputingblog/achieving-optimal-performance-for-deepseek-expert-parallelism-deepep-on-azure/4414699"
)
SRC_AFFINITY = (
    "os.sched_getaffinity vs the GPU's NVML CPU affinity (nvmlDeviceGetCpuAffinity); Azure HPC blog, 'Achieving "
    "Optimal Performance for DeepSeek Expert Parallelism (DeepEP) on Azure' (2025-05-16): techcommunity.microsoft.com/"
    "blog/azurehighperformancecomputingblog/achieving-optimal-performance-for-deepseek-expert-parallelism-deepep-on-azure/4414699"
)
SRC_OUTLIER = (
    "J. Zhang, 'Dense vs MoE: IB and GPU Communication Patterns' (2026): 2 of 10 Azure ND H100 v5 nodes thermally "
    "throttled made a 2-node job 2.4x slower; the slowest GPU sets the pace: "
    "jingchaozhang.github.io/Dense-vs-MoE-Communication-Patterns-on-Azure-H100"
)

# Clock-event reasons and how bad they are for a benchmark. NVML documents the hardware slowdowns as
# "reducing the core clocks by a factor of 2 or more"; a software power cap under full load is routine.
REASON_SEVERITY: dict[str, Status] = {
    "hw_slowdown": "fail",
    "hw_thermal_slowdown": "fail",
    "hw_power_brake_slowdown": "fail",
    "sw_thermal_slowdown": "warn",
    "board_limit": "warn",
    "reliability": "warn",
    "sw_power_cap": "info",
    "applications_clocks_setting": "info",
    "display_clock_setting": "info",
    "sync_boost": "info",
    "gpu_idle": "pass",
}


def _f(snap: HealthSnapshot, subject: str, check: str, status: Status, reason: str, source: str) -> Finding:
    return Finding(host=snap.host, subject=subject, check=check, status=status, reason=reason, source=source)


def reference_clock_mhz(gpu: GpuState) -> int | None:
    """The clock NVBench compares against: cudaDevAttrClockRate, which NVML reports as the max SM clock."""
    return gpu.max_sm_clock_mhz or gpu.default_app_sm_clock_mhz


def is_throttled(gpu: GpuState) -> bool:
    ref = reference_clock_mhz(gpu)
    return (
        gpu.loaded_sm_clock_mhz is not None
        and ref is not None
        and gpu.loaded_sm_clock_mhz < THROTTLE_FRACTION * ref
    )


def _gpu_clock(snap: HealthSnapshot, g: GpuState) -> Finding:
    ref = reference_clock_mhz(g)
    if g.loaded_sm_clock_mhz is None:
        why = g.unavailable.get("load", "no load was run (doctor --load-ms)")
        return _f(
            snap,
            g.label,
            "clock_under_load",
            "info",
            f"not measured: {why}; idle SM clock {g.sm_clock_mhz} MHz",
            SRC_NVBENCH,
        )
    if ref is None:
        return _f(
            snap,
            g.label,
            "clock_under_load",
            "info",
            f"{g.loaded_sm_clock_mhz:.0f} MHz under load; max clock unknown",
            SRC_NVBENCH,
        )
    pct = 100.0 * g.loaded_sm_clock_mhz / ref
    if is_throttled(g):
        return _f(
            snap, g.label, "clock_under_load", "fail",
            f"throttled: {g.loaded_sm_clock_mhz:.0f} MHz under load = {pct:.0f}% of {ref} MHz (< {THROTTLE_FRACTION:.0%})",
            SRC_NVBENCH,
        )  # fmt: skip
    return _f(
        snap,
        g.label,
        "clock_under_load",
        "pass",
        f"{g.loaded_sm_clock_mhz:.0f} MHz under load = {pct:.0f}% of {ref} MHz",
        SRC_NVBENCH,
    )


def _gpu_reasons(snap: HealthSnapshot, g: GpuState) -> Finding:
    reasons = sorted(set(g.clocks_event_reasons) | set(g.loaded_clocks_event_reasons))
    if g.clocks_event_mask is None and g.loaded_clocks_event_mask is None:
        return _f(
            snap,
            g.label,
            "clocks_event_reasons",
            "info",
            "not readable: " + g.unavailable.get("clocks_event_reasons", "?"),
            SRC_NVML_REASONS,
        )
    status = worst_status(REASON_SEVERITY.get(r, "warn") for r in reasons)
    bad = [r for r in reasons if REASON_SEVERITY.get(r, "warn") in ("warn", "fail")]
    text = (
        ("active: " + ", ".join(bad))
        if bad
        else ("none that slow a benchmark" + (f" ({', '.join(reasons)})" if reasons else ""))
    )
    return _f(snap, g.label, "clocks_event_reasons", status, text, SRC_NVML_REASONS)


def _gpu_temperature(snap: HealthSnapshot, g: GpuState) -> Finding:
    t = max((x for x in (g.temperature_c, g.loaded_temperature_c) if x is not None), default=None)
    if t is None:
        return _f(snap, g.label, "temperature", "info", "not readable", "NVML nvmlDeviceGetTemperature")
    limit = g.slowdown_temperature_c
    if limit is not None and t >= limit - 5:
        return _f(
            snap,
            g.label,
            "temperature",
            "warn",
            f"{t} °C, at or within 5 °C of the {limit} °C slowdown threshold",
            "NVML nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
        )
    return _f(
        snap,
        g.label,
        "temperature",
        "pass",
        f"{t} °C" + (f" (slowdown at {limit} °C)" if limit else ""),
        "NVML nvmlDeviceGetTemperature",
    )


def _gpu_ecc(snap: HealthSnapshot, g: GpuState) -> Finding:
    if g.ecc_enabled is None:
        return _f(snap, g.label, "ecc", "info", "ECC mode not readable", SRC_NVML_ECC)
    if not g.ecc_enabled:
        return _f(snap, g.label, "ecc", "info", "ECC is disabled", SRC_NVML_ECC)
    if (g.ecc_volatile_uncorrected or 0) > 0:
        return _f(
            snap,
            g.label,
            "ecc",
            "fail",
            f"{g.ecc_volatile_uncorrected} uncorrectable ECC errors since the last driver load",
            SRC_NVML_ECC,
        )
    if (g.ecc_aggregate_uncorrected or 0) > 0:
        return _f(
            snap,
            g.label,
            "ecc",
            "warn",
            f"{g.ecc_aggregate_uncorrected} uncorrectable ECC errors over the GPU's life (none since driver load)",
            SRC_NVML_ECC,
        )
    corrected = g.ecc_volatile_corrected or 0
    return _f(
        snap,
        g.label,
        "ecc",
        "pass",
        "no uncorrectable errors" + (f"; {corrected} corrected since driver load" if corrected else ""),
        SRC_NVML_ECC,
    )


def _gpu_memory_repair(snap: HealthSnapshot, g: GpuState) -> list[Finding]:
    out = []
    if g.remap_failure:
        out.append(
            _f(
                snap,
                g.label,
                "remapped_rows",
                "fail",
                "a row remapping failed: the GPU needs service",
                SRC_NVML_REMAP,
            )
        )
    elif g.remap_pending:
        out.append(
            _f(
                snap,
                g.label,
                "remapped_rows",
                "warn",
                "a row remap is pending: reset the GPU to apply it",
                SRC_NVML_REMAP,
            )
        )
    elif g.remap_pending is not None:
        out.append(
            _f(
                snap,
                g.label,
                "remapped_rows",
                "pass",
                f"{g.remapped_rows_correctable or 0} correctable / {g.remapped_rows_uncorrectable or 0} uncorrectable rows remapped",
                SRC_NVML_REMAP,
            )
        )
    if g.retired_pages_pending:
        out.append(
            _f(
                snap,
                g.label,
                "retired_pages",
                "warn",
                "a page retirement is pending: reset the GPU to apply it",
                SRC_NVML_PAGES,
            )
        )
    elif g.retired_pages_sbe is not None or g.retired_pages_dbe is not None:
        out.append(
            _f(
                snap,
                g.label,
                "retired_pages",
                "pass",
                f"{g.retired_pages_sbe or 0} single-bit / {g.retired_pages_dbe or 0} double-bit pages retired",
                SRC_NVML_PAGES,
            )
        )
    return out


def _gpu_pcie(snap: HealthSnapshot, g: GpuState) -> Finding:
    if g.pcie_width is None or g.pcie_width_max is None:
        return _f(snap, g.label, "pcie_link", "info", "PCIe link not readable", SRC_NVML_PCIE)
    problems = []
    if g.pcie_width < g.pcie_width_max:
        problems.append(f"width x{g.pcie_width} of x{g.pcie_width_max}")
    if g.pcie_gen_max is not None and g.pcie_gen_gpu_max is not None and g.pcie_gen_max < g.pcie_gen_gpu_max:
        problems.append(f"slot allows Gen{g.pcie_gen_max}, GPU supports Gen{g.pcie_gen_gpu_max}")
    if g.loaded_pcie_gen is not None and g.pcie_gen_max is not None and g.loaded_pcie_gen < g.pcie_gen_max:
        problems.append(f"Gen{g.loaded_pcie_gen} under load, max Gen{g.pcie_gen_max}")
    if problems:
        return _f(
            snap,
            g.label,
            "pcie_link",
            "warn",
            "PCIe link below its maximum: " + "; ".join(problems),
            SRC_NVML_PCIE,
        )
    gen = g.loaded_pcie_gen if g.loaded_pcie_gen is not None else g.pcie_gen
    note = (
        ""
        if g.loaded_pcie_gen is not None
        else " (idle GPUs lower their PCIe generation; measured under load it would be checked)"
    )
    return _f(
        snap,
        g.label,
        "pcie_link",
        "pass",
        f"Gen{gen} x{g.pcie_width} (max Gen{g.pcie_gen_max} x{g.pcie_width_max}){note}",
        SRC_NVML_PCIE,
    )


def _gpu_nvlink(snap: HealthSnapshot, g: GpuState) -> Finding:
    total = len(g.nvlinks)
    if total == 0:
        return _f(snap, g.label, "nvlink", "info", "no NVLink links reported", SRC_NVML_NVLINK)
    up = g.nvlinks_active
    speed = f" at {g.nvlink_speed_mbps} MB/s each" if g.nvlink_speed_mbps else ""
    if 0 < up < total:
        down = [str(link.link) for link in g.nvlinks if not link.active]
        return _f(
            snap,
            g.label,
            "nvlink",
            "warn",
            f"{up} of {total} NVLink links up (down: {','.join(down)}){speed}",
            SRC_NVML_NVLINK,
        )
    if up == 0:
        return _f(snap, g.label, "nvlink", "warn", f"none of {total} NVLink links is up", SRC_NVML_NVLINK)
    return _f(snap, g.label, "nvlink", "pass", f"{up} of {total} links up{speed}", SRC_NVML_NVLINK)


def _pairs(snap: HealthSnapshot) -> list[Finding]:
    out = []
    for pair in snap.gpu_pairs:
        subject = f"gpu{pair.a}-gpu{pair.b}"
        if pair.p2p_nvlink is None:
            out.append(
                _f(
                    snap,
                    subject,
                    "gpu_path",
                    "info",
                    f"NVLink P2P status not readable (common ancestor {pair.common_ancestor})",
                    SRC_TOPOLOGY,
                )
            )
        elif pair.p2p_nvlink != "OK":
            how = "with PCIe P2P" if pair.p2p_read == "OK" else "staged through host memory (no P2P)"
            out.append(
                _f(
                    snap,
                    subject,
                    "gpu_path",
                    "warn",
                    f"PCIe only, no NVLink ({how}; common ancestor {pair.common_ancestor})",
                    SRC_TOPOLOGY,
                )
            )
        else:
            out.append(_f(snap, subject, "gpu_path", "pass", "NVLink", SRC_TOPOLOGY))
    return out


def _nic(snap: HealthSnapshot, nic: NicState) -> list[Finding]:
    out = []
    for port in nic.ports:
        subject = f"{nic.name}/{port.port}"
        if port.state != "ACTIVE" or (port.phys_state is not None and port.phys_state != "LinkUp"):
            out.append(_f(snap, subject, "ib_port", "warn", f"port {port.state} ({port.phys_state})", SRC_IB))
        else:
            out.append(
                _f(snap, subject, "ib_port", "pass", f"ACTIVE, {port.rate} ({port.link_layer})", SRC_IB)
            )
    a = nic.atomics
    if a is None or a.cap is None:
        why = (
            "lspci could not read its capabilities (run as root)"
            if a is not None and a.access_denied
            else "no lspci facts"
        )
        out.append(_f(snap, nic.name, "pcie_atomics", "info", f"AtomicOps unknown: {why}", SRC_ATOMICS))
    elif not all(a.cap.values()):
        missing = ", ".join(k for k, v in a.cap.items() if not v)
        out.append(
            _f(
                snap,
                nic.name,
                "pcie_atomics",
                "warn",
                f"no PCIe AtomicOps ({missing}): NVSHMEM (DeepEP, IBGDA) skips this NIC; check PCI_ATOMIC_MODE in its firmware or leave it out of NVSHMEM_HCA_LIST",
                SRC_ATOMICS,
            )
        )
    elif a.ctl is not None and a.ctl.get("ReqEn") is False:
        out.append(
            _f(
                snap,
                nic.name,
                "pcie_atomics",
                "info",
                "AtomicOps capable, requester not enabled (AtomicOpsCtl: ReqEn-)",
                SRC_ATOMICS,
            )
        )
    else:
        out.append(_f(snap, nic.name, "pcie_atomics", "pass", "AtomicOps 32bit/64bit/128bitCAS", SRC_ATOMICS))
    link = nic.pci_link
    if (
        link is not None
        and link.cap_width
        and link.sta_width
        and (link.sta_width < link.cap_width or (link.sta_speed_gts or 0) < (link.cap_speed_gts or 0))
    ):
        out.append(
            _f(
                snap,
                nic.name,
                "nic_pcie_link",
                "warn",
                f"PCIe {link.sta_speed_gts}GT/s x{link.sta_width}, capable of {link.cap_speed_gts}GT/s x{link.cap_width}",
                "lspci -vvv LnkCap/LnkSta",
            )
        )
    return out


def _gpu_nic_numa(snap: HealthSnapshot) -> list[Finding]:
    nics = [n for n in snap.nics if n.numa_node is not None and any(p.state == "ACTIVE" for p in n.ports)]
    if not nics:
        return []
    out = []
    for g in snap.gpus:
        if g.numa_node is None:
            out.append(_f(snap, g.label, "gpu_nic_numa", "info", "GPU NUMA node unknown", SRC_NUMA))
            continue
        local = [n.name for n in nics if n.numa_node == g.numa_node]
        if local:
            out.append(
                _f(
                    snap,
                    g.label,
                    "gpu_nic_numa",
                    "pass",
                    f"NUMA {g.numa_node} shared with {', '.join(local)}",
                    SRC_NUMA,
                )
            )
        else:
            others = ", ".join(f"{n.name} (NUMA {n.numa_node})" for n in nics)
            out.append(
                _f(
                    snap,
                    g.label,
                    "gpu_nic_numa",
                    "warn",
                    f"no active NIC on the GPU's NUMA node {g.numa_node}: RDMA crosses sockets to {others}",
                    SRC_NUMA,
                )
            )
    return out


def _affinity(snap: HealthSnapshot) -> list[Finding]:
    if snap.process_cpulist is None:
        return []
    cpus = set(parse_cpulist(snap.process_cpulist))
    gpu = (
        next((g for g in snap.gpus if g.index == snap.local_gpu), None)
        if snap.local_gpu is not None
        else None
    )
    if gpu is None or gpu.cpulist is None:
        return [
            _f(
                snap,
                "host",
                "cpu_affinity",
                "info",
                f"process may run on {len(cpus)} CPUs ({snap.process_cpulist})",
                SRC_AFFINITY,
            )
        ]
    near = set(parse_cpulist(gpu.cpulist))
    if cpus <= near:
        return [
            _f(
                snap,
                gpu.label,
                "cpu_affinity",
                "pass",
                f"rank on CPUs {snap.process_cpulist}, local to its GPU",
                SRC_AFFINITY,
            )
        ]
    far = len(cpus - near)
    return [
        _f(
            snap,
            gpu.label,
            "cpu_affinity",
            "warn",
            f"rank may run on {far} CPUs outside its GPU's NUMA CPUs ({gpu.cpulist}): use --bind numa",
            SRC_AFFINITY,
        )
    ]


def evaluate(snap: HealthSnapshot) -> list[Finding]:
    """All rules for one node."""
    out: list[Finding] = []
    if "probe" in snap.unavailable:
        out.append(
            _f(
                snap,
                "host",
                "probe",
                "warn",
                "health probe failed: " + snap.unavailable["probe"],
                "moelab.health",
            )
        )
    elif not snap.nvml_available:
        out.append(
            _f(
                snap,
                "host",
                "nvml",
                "info",
                "GPU checks skipped: " + snap.unavailable.get("nvml", "NVML not available"),
                "nvidia-ml-py",
            )
        )
    for g in snap.gpus:
        if "handle" in g.unavailable:
            out.append(
                _f(
                    snap,
                    g.label,
                    "nvml_handle",
                    "fail",
                    g.unavailable["handle"],
                    "NVML nvmlDeviceGetHandleByIndex",
                )
            )
            continue
        out += [_gpu_clock(snap, g), _gpu_reasons(snap, g), _gpu_temperature(snap, g), _gpu_ecc(snap, g)]
        out += _gpu_memory_repair(snap, g)
        out += [_gpu_pcie(snap, g), _gpu_nvlink(snap, g)]
    out += _pairs(snap)
    if "nics" in snap.unavailable:
        out.append(_f(snap, "host", "nics", "info", snap.unavailable["nics"], SRC_IB))
    for nic in snap.nics:
        out += _nic(snap, nic)
    out += _gpu_nic_numa(snap)
    out += _affinity(snap)
    return out


def _throttles(g: GpuState) -> bool:
    reasons = set(g.clocks_event_reasons) | set(g.loaded_clocks_event_reasons)
    return is_throttled(g) or any(
        REASON_SEVERITY.get(r) == "fail" or r == "sw_thermal_slowdown" for r in reasons
    )


def compare_nodes(snaps: Sequence[HealthSnapshot]) -> list[Finding]:
    """Outliers across nodes (and across GPUs of one node): the slowest clocks, the nodes whose GPUs throttle,
    and hardware or drivers that differ, because one slow GPU sets the pace of every collective."""
    out: list[Finding] = []
    loaded = [(s, g) for s in snaps for g in s.gpus if g.loaded_sm_clock_mhz is not None]
    if len(loaded) >= 2:
        # compare as a fraction of each GPU's own max clock, so a lower-clocked model is not called sick
        relative = all(reference_clock_mhz(g) for _, g in loaded)

        def level(g: GpuState) -> float:
            clock = g.loaded_sm_clock_mhz or 0.0
            return clock / (reference_clock_mhz(g) or 1) if relative else clock

        def show(g: GpuState) -> str:
            clock = g.loaded_sm_clock_mhz or 0.0
            return (
                f"{clock:.0f} MHz ({level(g):.0%} of its {reference_clock_mhz(g)} MHz max)"
                if relative
                else f"{clock:.0f} MHz"
            )

        med = statistics.median(level(g) for _, g in loaded)
        med_text = f"{med:.0%}" if relative else f"{med:.0f} MHz"
        slow_s, slow_g = min(loaded, key=lambda sg: level(sg[1]))
        status: Status = "warn" if level(slow_g) < OUTLIER_FRACTION * med else "pass"
        out.append(
            Finding(
                host=slow_s.host, subject=slow_g.label, check="slowest_gpu", status=status,
                reason=f"slowest GPU under load: {show(slow_g)} vs median {med_text} over {len(loaded)} GPUs",
                source=SRC_OUTLIER,
            )
        )  # fmt: skip
        for s, g in loaded:
            if g is not slow_g and level(g) < OUTLIER_FRACTION * med:
                out.append(
                    Finding(
                        host=s.host,
                        subject=g.label,
                        check="slow_gpu",
                        status="warn",
                        reason=f"{show(g)} under load, below {OUTLIER_FRACTION:.0%} of the median {med_text}",
                        source=SRC_OUTLIER,
                    )
                )
    for s in snaps if len(snaps) >= 2 else ():
        bad = [g.label for g in s.gpus if _throttles(g)]
        if bad:
            out.append(
                Finding(
                    host=s.host,
                    subject="node",
                    check="throttling_node",
                    status="warn",
                    reason=f"{len(bad)} of {len(s.gpus)} GPUs throttle ({', '.join(bad)}): this node sets the pace of a multi-node job",
                    source=SRC_OUTLIER,
                )
            )
    if len(snaps) >= 2:
        for what, values in (
            ("gpu_models", {s.host: tuple(sorted({g.name or "?" for g in s.gpus})) for s in snaps}),
            ("driver_versions", {s.host: (s.driver_version or "?",) for s in snaps}),
            (
                "nic_rates",
                {
                    s.host: tuple(
                        sorted({p.rate or "?" for n in s.nics for p in n.ports if p.state == "ACTIVE"})
                    )
                    for s in snaps
                },
            ),
        ):
            distinct = set(values.values())
            if len(distinct) > 1:
                detail = "; ".join(f"{h}: {', '.join(v) or '-'}" for h, v in sorted(values.items()))
                out.append(
                    Finding(
                        host="*",
                        subject="cluster",
                        check=what,
                        status="warn",
                        reason=f"nodes differ in {what.replace('_', ' ')}: {detail}",
                        source="moelab doctor cross-node comparison",
                    )
                )
    return out


def worst(findings: Iterable[Finding]) -> Status:
    return worst_status(f.status for f in findings)
