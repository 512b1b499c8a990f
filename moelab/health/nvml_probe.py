"""Per-GPU state through NVML (nvidia-ml-py's `pynvml`), passed in as a module-like object.

Each NVML call is tried on its own: a field that a GPU or driver does not support becomes None with the
NVML error in `unavailable`, never a failed probe. The optional load (a few hundred ms of bf16 matmuls on
that GPU) is what makes clocks meaningful: an idle GPU shows idle clocks and a lowered PCIe generation.
"""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from moelab.health.model import GpuPair, GpuState, NvLinkState
from moelab.job.sysfs import format_cpulist, normalize_bus_id

# (NVML constant, bit, short name). Bits are NVML's ABI (nvml.h, "NvmlClocksEventReasons"); a test checks them
# against the installed pynvml. The older nvmlClocksThrottleReason* names carry the same bits.
CLOCKS_EVENT_REASONS: tuple[tuple[str, int, str], ...] = (
    ("nvmlClocksEventReasonGpuIdle", 0x1, "gpu_idle"),
    ("nvmlClocksEventReasonApplicationsClocksSetting", 0x2, "applications_clocks_setting"),
    ("nvmlClocksEventReasonSwPowerCap", 0x4, "sw_power_cap"),
    ("nvmlClocksEventReasonHwSlowdown", 0x8, "hw_slowdown"),
    ("nvmlClocksEventReasonSyncBoost", 0x10, "sync_boost"),
    ("nvmlClocksEventReasonSwThermalSlowdown", 0x20, "sw_thermal_slowdown"),
    ("nvmlClocksEventReasonHwThermalSlowdown", 0x40, "hw_thermal_slowdown"),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", 0x80, "hw_power_brake_slowdown"),
    ("nvmlClocksEventReasonDisplayClockSetting", 0x100, "display_clock_setting"),
    ("nvmlClocksThrottleReasonBoardLimit", 0x200, "board_limit"),
    ("nvmlClocksThrottleReasonReliability", 0x400, "reliability"),
)

TOPOLOGY_LEVELS = ("INTERNAL", "SINGLE", "MULTIPLE", "HOSTBRIDGE", "NODE", "SYSTEM")
P2P_STATUSES = (
    "OK",
    "CHIPSET_NOT_SUPPORTED",
    "GPU_NOT_SUPPORTED",
    "IOH_TOPOLOGY_NOT_SUPPORTED",
    "DISABLED_BY_REGKEY",
    "NOT_SUPPORTED",
    "UNKNOWN",
)


def decode_clocks_event_reasons(mask: int) -> tuple[str, ...]:
    """NVML clocks-event bitmask → short names, in bit order; unknown bits as "bit0x…"."""
    names = [name for _, bit, name in CLOCKS_EVENT_REASONS if mask & bit]
    known = 0
    for _, bit, _ in CLOCKS_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"bit{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def _const_name(nvml: Any, prefix: str, value: int, names: Sequence[str]) -> str:
    for name in names:
        if getattr(nvml, prefix + name, None) == value:
            return name
    return f"{value}"


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuIdentity:
    """Who a load runs on: NVML's index and the ids that map it to a CUDA ordinal."""

    nvml_index: int
    uuid: str | None
    pci_bus_id: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadSample:
    sm_clock_mhz: int | None
    clocks_event_mask: int | None
    temperature_c: int | None
    pcie_gen: int | None
    # NVML's cumulative violation counters (ns the clocks were held below the application clocks for thermal
    # or power reasons), read with every sample: their growth between the first and the last sample is how
    # long the load ran throttled, whatever the reason bits showed at the instants sampled
    thermal_violation_ns: int | None = None
    power_violation_ns: int | None = None
    at_s: float | None = None  # time.monotonic() when taken


# (gpu, seconds, sample) → the samples taken while the load ran
LoadFn = Callable[[GpuIdentity, float, Callable[[], LoadSample]], list[LoadSample]]


class _Probe:
    """Runs NVML calls, recording why each one that failed did."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self.unavailable: dict[str, str] = {}

    def call(self, key: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self.unavailable[key] = f"{fn_name} not in this nvidia-ml-py"
            return None
        try:
            return fn(*args)
        except (self.error_type, ctypes.ArgumentError) as exc:
            self.unavailable[key] = f"{fn_name}: {exc}"
            return None

    def const(self, name: str) -> Any:
        return nvml_const(self.nvml, name)


def nvml_const(nvml: Any, name: str) -> Any:
    """A pynvml constant. nvidia-ml-py 13 defines `NVML_P2P_CAPS_INDEX_READ = 0,` (a tuple, by a stray
    comma); ctypes would refuse it, so a one-element tuple is unwrapped."""
    value = getattr(nvml, name)
    return value[0] if isinstance(value, tuple) and len(value) == 1 else value


def _text(v: Any) -> str | None:
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _cpus_from_words(words: Sequence[int]) -> list[int]:
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]


def _field_uint(p: _Probe, handle: Any, key: str, field_name: str) -> int | None:
    fid = getattr(p.nvml, field_name, None)
    if fid is None:
        p.unavailable[key] = f"{field_name} not in this nvidia-ml-py"
        return None
    values = p.call(key, "nvmlDeviceGetFieldValues", handle, [fid])
    if values is None:
        return None
    v = values[0]
    if v.nvmlReturn != getattr(p.nvml, "NVML_SUCCESS", 0):
        p.unavailable[key] = f"{field_name}: NVML return {v.nvmlReturn}"
        return None
    vt = v.valueType
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        vt, "ullVal"
    )
    return int(getattr(v.value, member))


def _probe_gpu(
    nvml: Any, index: int, num_cpus: int, load: LoadFn | None, load_ms: float
) -> tuple[Any, GpuState]:
    """One GPU's state: what can only be read idle first, then `load` (if any), then clocks and links."""
    p = _Probe(nvml)
    h = p.call("handle", "nvmlDeviceGetHandleByIndex", index)
    if h is None:
        return None, GpuState(index=index, unavailable=p.unavailable)
    pci = p.call("pci", "nvmlDeviceGetPciInfo", h)
    bus_id = normalize_bus_id(_text(pci.busId) or "") if pci is not None and _text(pci.busId) else None
    words = p.call("cpu_affinity", "nvmlDeviceGetCpuAffinity", h, max(1, (num_cpus + 63) // 64))
    throttling = _throttling_fields(p, h)
    memory = _memory_fields(p, h)
    links = _nvlinks(p, h)
    speed = _field_uint(p, h, "nvlink_speed", "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON") if links else None
    uuid = _text(p.call("uuid", "nvmlDeviceGetUUID", h))
    samples: list[LoadSample] = []
    if load is not None and load_ms > 0:
        samples = _run_load(p, h, GpuIdentity(nvml_index=index, uuid=uuid, pci_bus_id=bus_id), load, load_ms)
    state = GpuState(
        index=index,
        name=_text(p.call("name", "nvmlDeviceGetName", h)),
        uuid=uuid,
        pci_bus_id=bus_id,
        numa_node=p.call("numa_node", "nvmlDeviceGetNumaNodeId", h),
        cpulist=format_cpulist(_cpus_from_words(list(words))) if words is not None else None,
        **_clock_fields(p, h),
        **throttling,
        **_loaded_fields(samples, load_ms),
        **memory,
        nvlinks=links,
        nvlink_speed_mbps=speed,
        **_pcie_fields(p, h),
        unavailable=p.unavailable,
    )
    return h, state


def _throttling_fields(p: _Probe, h: Any) -> dict[str, Any]:
    """Clock-event reasons now (the older throttle-reasons call where the newer one is missing) and the
    cumulative thermal and power violation counters."""
    mask = p.call("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = p.call("clocks_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if mask is not None:
            p.unavailable.pop("clocks_event_reasons", None)
    thermal = p.call(
        "thermal_violation", "nvmlDeviceGetViolationStatus", h, p.const("NVML_PERF_POLICY_THERMAL")
    )
    power = p.call("power_violation", "nvmlDeviceGetViolationStatus", h, p.const("NVML_PERF_POLICY_POWER"))
    return dict(
        clocks_event_mask=mask,
        clocks_event_reasons=decode_clocks_event_reasons(mask) if mask is not None else (),
        thermal_violation_ns=int(thermal.violationTime) if thermal is not None else None,
        power_violation_ns=int(power.violationTime) if power is not None else None,
    )


def _memory_fields(p: _Probe, h: Any) -> dict[str, Any]:
    """ECC mode and counters, remapped rows and retired pages: the memory's health."""
    c = p.const
    ecc_mode = p.call("ecc", "nvmlDeviceGetEccMode", h)
    ecc_on = bool(ecc_mode[0]) if ecc_mode is not None else None
    ecc: dict[str, int | None] = {}
    if ecc_on:
        for counter, ctype in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC")):
            for kind, etype in (
                ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
            ):
                ecc[f"{counter}_{kind}"] = p.call(
                    f"ecc_{counter}_{kind}", "nvmlDeviceGetTotalEccErrors", h, c(etype), c(ctype)
                )
    rows = p.call("remapped_rows", "nvmlDeviceGetRemappedRows", h)
    sbe_cause = c("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS")
    sbe = p.call("retired_pages", "nvmlDeviceGetRetiredPages", h, sbe_cause)
    dbe_cause = c("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")
    dbe = p.call("retired_pages", "nvmlDeviceGetRetiredPages", h, dbe_cause)
    pending = p.call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
    return dict(
        ecc_enabled=ecc_on,
        ecc_volatile_corrected=ecc.get("volatile_corrected"),
        ecc_volatile_uncorrected=ecc.get("volatile_uncorrected"),
        ecc_aggregate_corrected=ecc.get("aggregate_corrected"),
        ecc_aggregate_uncorrected=ecc.get("aggregate_uncorrected"),
        remapped_rows_correctable=rows[0] if rows is not None else None,
        remapped_rows_uncorrectable=rows[1] if rows is not None else None,
        remap_pending=bool(rows[2]) if rows is not None else None,
        remap_failure=bool(rows[3]) if rows is not None else None,
        retired_pages_sbe=len(sbe) if sbe is not None else None,
        retired_pages_dbe=len(dbe) if dbe is not None else None,
        retired_pages_pending=bool(pending) if pending is not None else None,
    )


def _nvlinks(p: _Probe, h: Any) -> tuple[NvLinkState, ...]:
    """Every NVLink the GPU answers for: links beyond its count (or no NVLink at all) raise and are skipped."""
    links = []
    for link in range(int(getattr(p.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = p.nvml.nvmlDeviceGetNvLinkState(h, link)
        except p.error_type:
            continue
        try:
            version = int(p.nvml.nvmlDeviceGetNvLinkVersion(h, link))
        except p.error_type:
            version = None
        links.append(NvLinkState(link=link, active=bool(state), version=version))
    return tuple(links)


def _clock_fields(p: _Probe, h: Any) -> dict[str, Any]:
    c = p.const
    return dict(
        temperature_c=p.call("temperature", "nvmlDeviceGetTemperature", h, c("NVML_TEMPERATURE_GPU")),
        slowdown_temperature_c=p.call(
            "slowdown_temperature",
            "nvmlDeviceGetTemperatureThreshold",
            h,
            c("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
        ),
        sm_clock_mhz=p.call("sm_clock", "nvmlDeviceGetClockInfo", h, c("NVML_CLOCK_SM")),
        max_sm_clock_mhz=p.call("max_sm_clock", "nvmlDeviceGetMaxClockInfo", h, c("NVML_CLOCK_SM")),
        default_app_sm_clock_mhz=p.call(
            "default_app_sm_clock", "nvmlDeviceGetDefaultApplicationsClock", h, c("NVML_CLOCK_SM")
        ),
    )


def _pcie_fields(p: _Probe, h: Any) -> dict[str, Any]:
    return dict(
        pcie_gen=p.call("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
        pcie_gen_max=p.call("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h),
        pcie_gen_gpu_max=p.call("pcie_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
        pcie_width=p.call("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h),
        pcie_width_max=p.call("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", h),
        pcie_replay_count=_field_uint(p, h, "pcie_replay", "NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
    )


def _run_load(p: _Probe, h: Any, gpu: GpuIdentity, load: LoadFn, load_ms: float) -> list[LoadSample]:
    """NVML read a few times while `load` keeps the GPU busy: clock, clock-event reasons, temperature, PCIe
    generation and the cumulative violation counters; the reason in `p.unavailable` when it cannot run."""
    c, nvml = p.const, p.nvml

    def sample() -> LoadSample:
        sp = _Probe(nvml)
        thermal_v = sp.call("v", "nvmlDeviceGetViolationStatus", h, c("NVML_PERF_POLICY_THERMAL"))
        power_v = sp.call("v", "nvmlDeviceGetViolationStatus", h, c("NVML_PERF_POLICY_POWER"))
        return LoadSample(
            sm_clock_mhz=sp.call("c", "nvmlDeviceGetClockInfo", h, c("NVML_CLOCK_SM")),
            clocks_event_mask=sp.call("r", "nvmlDeviceGetCurrentClocksEventReasons", h),
            temperature_c=sp.call("t", "nvmlDeviceGetTemperature", h, c("NVML_TEMPERATURE_GPU")),
            pcie_gen=sp.call("g", "nvmlDeviceGetCurrPcieLinkGeneration", h),
            thermal_violation_ns=int(thermal_v.violationTime) if thermal_v is not None else None,
            power_violation_ns=int(power_v.violationTime) if power_v is not None else None,
            at_s=time.monotonic(),
        )

    samples: list[LoadSample] = []
    try:
        samples = load(gpu, load_ms / 1000.0, sample)
    except Exception as exc:  # a load that cannot run (no CUDA, GPU hidden) leaves the idle facts
        p.unavailable["load"] = f"{type(exc).__name__}: {exc}"
    if not samples and "load" not in p.unavailable:
        p.unavailable["load"] = "no samples taken under load"
    return samples


def _loaded_fields(samples: Sequence[LoadSample], load_ms: float) -> dict[str, Any]:
    """GpuState's `loaded_*` fields from the samples taken under load (empty values without samples)."""

    def vals(attr: str) -> list[int]:
        return [getattr(s, attr) for s in samples if getattr(s, attr) is not None]

    mask = 0
    reason_counts: dict[str, int] = {}
    for m in vals("clocks_event_mask"):
        mask |= m
        for name in decode_clocks_event_reasons(m):
            reason_counts[name] = reason_counts.get(name, 0) + 1
    clocks = vals("sm_clock_mhz")
    return {
        "load_ms": load_ms if samples else None,
        "loaded_sm_clock_mhz": float(statistics.median(clocks)) if clocks else None,
        "loaded_clocks_event_mask": mask if samples else None,
        "loaded_clocks_event_reasons": decode_clocks_event_reasons(mask) if samples else (),
        "loaded_samples": len(samples) if samples else None,
        "loaded_reason_samples": reason_counts,
        "loaded_sm_clock_min_mhz": min(clocks, default=None),
        "loaded_thermal_violation_ns": _growth(vals("thermal_violation_ns")),
        "loaded_power_violation_ns": _growth(vals("power_violation_ns")),
        "loaded_window_ms": _window_ms(samples),
        "loaded_temperature_c": max(vals("temperature_c"), default=None),
        "loaded_pcie_gen": max(vals("pcie_gen"), default=None),
    }


def _growth(values: Sequence[int]) -> int | None:
    """How much a cumulative counter grew over the samples (None with fewer than two readings)."""
    return max(0, values[-1] - values[0]) if len(values) >= 2 else None


def _window_ms(samples: Sequence[LoadSample]) -> float | None:
    times = [s.at_s for s in samples if s.at_s is not None]
    return 1000.0 * (times[-1] - times[0]) if len(times) >= 2 else None


def _probe_pair(nvml: Any, a: int, b: int, ha: Any, hb: Any) -> GpuPair:
    p = _Probe(nvml)
    level = p.call("topology", "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
    nvlink = p.call("p2p", "nvmlDeviceGetP2PStatus", ha, hb, p.const("NVML_P2P_CAPS_INDEX_NVLINK"))
    read = p.call("p2p", "nvmlDeviceGetP2PStatus", ha, hb, p.const("NVML_P2P_CAPS_INDEX_READ"))
    return GpuPair(
        a=a,
        b=b,
        common_ancestor=_const_name(nvml, "NVML_TOPOLOGY_", level, TOPOLOGY_LEVELS)
        if level is not None
        else None,
        p2p_nvlink=_const_name(nvml, "NVML_P2P_STATUS_", nvlink, P2P_STATUSES)
        if nvlink is not None
        else None,
        p2p_read=_const_name(nvml, "NVML_P2P_STATUS_", read, P2P_STATUSES) if read is not None else None,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class NvmlReport:
    available: bool
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    gpus: tuple[GpuState, ...] = ()
    pairs: tuple[GpuPair, ...] = ()
    unavailable: dict[str, str] | None = None


def probe_nvml(nvml: Any, *, num_cpus: int, load: LoadFn | None = None, load_ms: float = 0.0) -> NvmlReport:
    """Every GPU NVML sees (NVML indices ignore CUDA_VISIBLE_DEVICES), and every pair's path between them."""
    error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error_type as exc:
        return NvmlReport(available=False, unavailable={"nvml": f"nvmlInit: {exc}"})
    try:
        p = _Probe(nvml)
        count = p.call("gpus", "nvmlDeviceGetCount") or 0
        handles: list[Any] = []
        gpus = []
        for i in range(count):
            h, state = _probe_gpu(nvml, i, num_cpus, load, load_ms)
            handles.append(h)
            gpus.append(state)
        pairs = [
            _probe_pair(nvml, a, b, handles[a], handles[b])
            for a in range(count)
            for b in range(a + 1, count)
            if handles[a] is not None and handles[b] is not None
        ]
        cuda = p.call("cuda_driver", "nvmlSystemGetCudaDriverVersion")
        return NvmlReport(
            available=True,
            driver_version=_text(p.call("driver", "nvmlSystemGetDriverVersion")),
            cuda_driver_version=int(cuda) if cuda is not None else None,
            gpus=tuple(gpus),
            pairs=tuple(pairs),
            unavailable=p.unavailable,
        )
    finally:
        with contextlib.suppress(error_type):
            nvml.nvmlShutdown()


def torch_matmul_load(gpu: GpuIdentity, seconds: float, sample: Callable[[], LoadSample]) -> list[LoadSample]:
    """Keep the GPU busy with bf16 matmuls for `seconds`, sampling NVML in the second half of the window.

    The CUDA ordinal is found by UUID (NVML counts every GPU; CUDA honours CUDA_VISIBLE_DEVICES).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch")
    ordinal = None
    want = (gpu.uuid or "").lower().removeprefix("gpu-")
    for i in range(torch.cuda.device_count()):
        if want and str(torch.cuda.get_device_properties(i).uuid).lower().removeprefix("gpu-") == want:
            ordinal = i
            break
    if ordinal is None:
        raise RuntimeError(f"NVML GPU {gpu.nvml_index} is not visible to CUDA in this process")
    dev = torch.device("cuda", ordinal)
    with torch.cuda.device(dev):
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        torch.matmul(a, b)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        torch.cuda.synchronize(dev)
        chunk = max(1, int(0.02 / max((time.perf_counter() - t0) / 4, 1e-6)))  # ~20 ms of matmuls
        # keep 2-3 chunks queued: the GPU never idles, and the host never runs far ahead of it
        pending: deque[torch.cuda.Event] = deque()
        samples: list[LoadSample] = []
        start = time.perf_counter()
        next_sample = start + seconds / 2
        while (now := time.perf_counter()) < start + seconds or len(samples) < 3:
            for _ in range(chunk):
                torch.matmul(a, b)
            ev = torch.cuda.Event()
            ev.record()
            pending.append(ev)
            while len(pending) > 3:
                pending.popleft().synchronize()
            if now >= next_sample:
                samples.append(sample())
                next_sample = now + seconds / 10
        torch.cuda.synchronize(dev)
        del a, b
        torch.cuda.empty_cache()
    return samples
