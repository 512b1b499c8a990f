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
"""NVBench's default `--throttle-threshold`: a clock under load below 75% of the default SM clock. Here it
only prompts a look (warn) when no clock-event reason explains it; it never fails a card on its own: a
healthy H100 under its own matmul load sits at its power cap, between ~71% and ~75% of its max clock."""

OUTLIER_FRACTION = 0.90
"""Across GPUs/nodes: a loaded clock (as a fraction of its max) this far below the median names its GPU as a
pace setter. Power capping moves healthy GPUs by a few percent; a thermally throttled one by tens."""

PERSISTENT_SAMPLES = 2
"""Under load, a thermal or hardware slowdown seen in this many samples (or in every one, with fewer) fails."""

THERMAL_VIOLATION_MIN_NS = 1_000_000
"""Thermal violation time under the load that counts as throttling: 1 ms (the counter is in ns; a healthy
card's stays at 0)."""

NVML_DOCS = "https://docs.nvidia.com/deploy/nvml-api/"
SRC_NVBENCH = (
    "NVBench measure_cold --throttle-threshold (0.75 × the default SM clock): a prompt to look, not a verdict"
)
SRC_THROTTLE = (
    f"NVML clocks-event reasons and violation counters sampled under load ({NVML_DOCS}: "
    "nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetViolationStatus): thermal and hardware slowdowns "
    "fail; the software power cap under full load is routine"
)
SRC_NVML_REASONS = f"NVML nvmlDeviceGetCurrentClocksEventReasons (nvmlClocksEventReasons*, {NVML_DOCS})"
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
# "reducing the core clocks by a factor of 2 or more"; a thermal slowdown means the card is too hot to hold
# its clocks; a software power cap under full load is routine (a card at its power limit).
REASON_SEVERITY: dict[str, Status] = {
    "hw_slowdown": "fail",
    "hw_thermal_slowdown": "fail",
    "hw_power_brake_slowdown": "fail",
    "sw_thermal_slowdown": "fail",
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


def reason_severity(g: GpuState, reason: str, phase: str) -> Status:
    """How bad a clock-event reason is for this GPU. Under load a slowdown must be seen in at least two of
    the samples to fail: NVML also reports a hardware slowdown "during PState or clock change" (DCGM's
    field documentation), which one sample can catch on a healthy card; seen once it is worth knowing (info)."""
    status = REASON_SEVERITY.get(reason, "warn")
    if status != "fail" or phase != "under load" or not g.loaded_reason_samples or not g.loaded_samples:
        return status
    seen = g.loaded_reason_samples.get(reason, 0)
    return "fail" if seen >= min(PERSISTENT_SAMPLES, g.loaded_samples) else "info"


def throttle_cause(gpu: GpuState) -> str | None:
    """Why this GPU must not be benchmarked on now, from what NVML said rather than from one clock reading:
    a thermal or hardware slowdown among the clock-event reasons (idle, or in several samples under load),
    or thermal violation time accumulated while the load ran. None for a healthy card, one at its power
    cap under load included."""
    causes = []
    for phase, reasons in (
        ("idle", gpu.clocks_event_reasons),
        ("under load", gpu.loaded_clocks_event_reasons),
    ):
        bad = [r for r in reasons if reason_severity(gpu, r, phase) == "fail"]
        if bad:
            seen = gpu.loaded_reason_samples if phase == "under load" else {}
            shown = [f"{r} ({seen[r]} of {gpu.loaded_samples} samples)" if r in seen else r for r in bad]
            causes.append(f"{', '.join(shown)} {phase}")
    thermal = gpu.loaded_thermal_violation_ns
    if thermal is not None and thermal >= THERMAL_VIOLATION_MIN_NS:
        window = f" of {gpu.loaded_window_ms:.0f} ms" if (gpu.loaded_window_ms or 0) >= 1 else ""
        causes.append(f"clocks held down for thermal reasons {thermal / 1e6:.1f} ms{window} under load")
    return "; ".join(causes) or None


def power_capped(g: GpuState) -> bool:
    """Held at its power limit under load: the reason bit in a sample, or power violation time growing."""
    return "sw_power_cap" in g.loaded_clocks_event_reasons or (g.loaded_power_violation_ns or 0) > 0


def is_throttled(gpu: GpuState) -> bool:
    return throttle_cause(gpu) is not None


def _gpu_clock(snap: HealthSnapshot, g: GpuState) -> Finding:
    ref = reference_clock_mhz(g)
    if g.loaded_sm_clock_mhz is None:
        why = g.unavailable.get("load", "no load was run (doctor --load-ms)")
        cause = throttle_cause(g)
        if cause:
            return _f(snap, g.label, "clock_under_load", "fail", f"throttled: {cause}", SRC_THROTTLE)
        return _f(
            snap,
            g.label,
            "clock_under_load",
            "info",
            f"not measured: {why}; idle SM clock {g.sm_clock_mhz} MHz",
            SRC_THROTTLE,
        )
    clock = f"{g.loaded_sm_clock_mhz:.0f} MHz under load" + (
        f" = {100.0 * g.loaded_sm_clock_mhz / ref:.0f}% of {ref} MHz" if ref else ""
    )
    cause = throttle_cause(g)
    if cause:
        return _f(snap, g.label, "clock_under_load", "fail", f"throttled: {clock} ({cause})", SRC_THROTTLE)
    if ref is None or g.loaded_sm_clock_mhz >= THROTTLE_FRACTION * ref:
        return _f(snap, g.label, "clock_under_load", "pass", clock + _held_by(g), SRC_THROTTLE)
    if power_capped(g):
        return _f(snap, g.label, "clock_under_load", "pass", clock + _held_by(g), SRC_THROTTLE)
    if g.loaded_clocks_event_mask is None:
        why = "and the clock-event reasons are unreadable"
    else:
        why = "with no clock-event reason from NVML to explain it (see nvidia-smi -q -d PERFORMANCE)"
    reason = f"{clock}, below {THROTTLE_FRACTION:.0%} of the max clock {why}"
    return _f(snap, g.label, "clock_under_load", "warn", reason, SRC_NVBENCH)


def _held_by(g: GpuState) -> str:
    """What held the clock, in words, when NVML says it was the routine power cap (and nothing worse)."""
    if not power_capped(g):
        return ""
    power = g.loaded_power_violation_ns
    held = f" ({power / 1e6:.0f} ms of the load)" if power else ""
    return f", held at the software power cap{held}: routine under a full matmul load, no thermal or hardware slowdown"


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
    severity = {
        r: worst_status(
            [reason_severity(g, r, "idle")] * (r in g.clocks_event_reasons)
            + [reason_severity(g, r, "under load")] * (r in g.loaded_clocks_event_reasons)
        )
        for r in reasons
    }
    status = worst_status(severity.values())
    bad = [r for r in reasons if severity[r] in ("warn", "fail")]
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
    status, reason = _atomics_verdict(nic)
    out.append(_f(snap, nic.name, "pcie_atomics", status, reason, SRC_ATOMICS))
    link = nic.pci_link
    if (
        link is not None
        and link.cap_width
        and link.sta_width
        and (link.sta_width < link.cap_width or (link.sta_speed_gts or 0) < (link.cap_speed_gts or 0))
    ):
        reason = f"PCIe {link.sta_speed_gts}GT/s x{link.sta_width}, capable of {link.cap_speed_gts}GT/s x{link.cap_width}"
        out.append(_f(snap, nic.name, "nic_pcie_link", "warn", reason, "lspci -vvv LnkCap/LnkSta"))
    return out


def _atomics_verdict(nic: NicState) -> tuple[Status, str]:
    """PCIe AtomicOps, which NVSHMEM needs of a NIC: unknown without lspci's facts, warn when missing."""
    a = nic.atomics
    if a is None or a.cap is None:
        why = (
            "lspci could not read its capabilities (run as root)"
            if a is not None and a.access_denied
            else "no lspci facts"
        )
        return "info", f"AtomicOps unknown: {why}"
    if not all(a.cap.values()):
        missing = ", ".join(k for k, v in a.cap.items() if not v)
        return (
            "warn",
            f"no PCIe AtomicOps ({missing}): NVSHMEM (DeepEP, IBGDA) skips this NIC; check PCI_ATOMIC_MODE in "
            "its firmware or leave it out of NVSHMEM_HCA_LIST",
        )
    if a.ctl is not None and a.ctl.get("ReqEn") is False:
        return "info", "AtomicOps capable, requester not enabled (AtomicOpsCtl: ReqEn-)"
    return "pass", "AtomicOps 32bit/64bit/128bitCAS"


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


def compare_nodes(snaps: Sequence[HealthSnapshot]) -> list[Finding]:
    """Outliers across nodes (and across GPUs of one node): the slowest clocks, the nodes whose GPUs throttle,
    and hardware or drivers that differ, because one slow GPU sets the pace of every collective."""
    out = _slow_gpus(snaps)
    if len(snaps) < 2:
        return out
    for s in snaps:
        bad = [g.label for g in s.gpus if is_throttled(g)]
        if bad:
            reason = f"{len(bad)} of {len(s.gpus)} GPUs throttle ({', '.join(bad)}): this node sets the pace of a multi-node job"
            out.append(_node_finding(s.host, "node", "throttling_node", reason, SRC_OUTLIER))
    for what, values in (
        ("gpu_models", {s.host: tuple(sorted({g.name or "?" for g in s.gpus})) for s in snaps}),
        ("driver_versions", {s.host: (s.driver_version or "?",) for s in snaps}),
        ("nic_rates", {s.host: _active_rates(s) for s in snaps}),
    ):
        if len(set(values.values())) > 1:
            detail = "; ".join(f"{h}: {', '.join(v) or '-'}" for h, v in sorted(values.items()))
            reason = f"nodes differ in {what.replace('_', ' ')}: {detail}"
            out.append(_node_finding("*", "cluster", what, reason, "moelab doctor cross-node comparison"))
    return out


def _node_finding(host: str, subject: str, check: str, reason: str, source: str) -> Finding:
    return Finding(host=host, subject=subject, check=check, status="warn", reason=reason, source=source)


def _active_rates(s: HealthSnapshot) -> tuple[str, ...]:
    return tuple(sorted({p.rate or "?" for n in s.nics for p in n.ports if p.state == "ACTIVE"}))


def _slow_gpus(snaps: Sequence[HealthSnapshot]) -> list[Finding]:
    """The slowest loaded GPU (warn when under OUTLIER_FRACTION of the median) and every other one that low,
    as a fraction of each GPU's own max clock so that a lower-clocked model is not called sick."""
    loaded = [(s, g) for s in snaps for g in s.gpus if g.loaded_sm_clock_mhz is not None]
    if len(loaded) < 2:
        return []
    relative = all(reference_clock_mhz(g) for _, g in loaded)

    def level(g: GpuState) -> float:
        clock = g.loaded_sm_clock_mhz or 0.0
        return clock / (reference_clock_mhz(g) or 1) if relative else clock

    def show(g: GpuState) -> str:
        clock = g.loaded_sm_clock_mhz or 0.0
        if relative:
            return f"{clock:.0f} MHz ({level(g):.0%} of its {reference_clock_mhz(g)} MHz max)"
        return f"{clock:.0f} MHz"

    med = statistics.median(level(g) for _, g in loaded)
    med_text = f"{med:.0%}" if relative else f"{med:.0f} MHz"
    slow_s, slow_g = min(loaded, key=lambda sg: level(sg[1]))
    status: Status = "warn" if level(slow_g) < OUTLIER_FRACTION * med else "pass"
    reason = f"slowest GPU under load: {show(slow_g)} vs median {med_text} over {len(loaded)} GPUs"
    out = [
        Finding(
            host=slow_s.host,
            subject=slow_g.label,
            check="slowest_gpu",
            status=status,
            reason=reason,
            source=SRC_OUTLIER,
        )
    ]
    for s, g in loaded:
        if g is not slow_g and level(g) < OUTLIER_FRACTION * med:
            reason = f"{show(g)} under load, below {OUTLIER_FRACTION:.0%} of the median {med_text}"
            out.append(_node_finding(s.host, g.label, "slow_gpu", reason, SRC_OUTLIER))
    return out


def worst(findings: Iterable[Finding]) -> Status:
    return worst_status(f.status for f in findings)
