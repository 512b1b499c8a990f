"""The health data model: what a probe saw on one node, and what the rules concluded.

Plain frozen dataclasses that round-trip through JSON (`to_dict` / `from_dict`), so a node's snapshot can be
written by a rank or a remote doctor, carried back, stored in the `health` table and compared across nodes.
A field is None when it could not be read; `unavailable` says why, keyed by the probe that failed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

SNAPSHOT_VERSION = 1

Status = Literal["pass", "info", "warn", "fail"]
STATUS_RANK: dict[str, int] = {"pass": 0, "info": 0, "warn": 1, "fail": 2}
"""Health severity: pass and info are both healthy (info: not checked, or worth knowing)."""

_DISPLAY_ORDER: dict[str, int] = {"pass": 0, "info": 1, "warn": 2, "fail": 3}


def worst_status(statuses: typing.Iterable[str]) -> Status:
    """The most severe of the statuses (info outranks pass, so an unchecked item shows)."""
    worst: Status = "pass"
    for s in statuses:
        if _DISPLAY_ORDER[s] > _DISPLAY_ORDER[worst]:
            worst = typing.cast(Status, s)
    return worst


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One rule's verdict about one subject (a GPU, a GPU pair, a NIC, the host) on one node."""

    host: str
    subject: str
    check: str
    status: Status
    reason: str
    source: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.host, self.subject, self.check)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class NvLinkState:
    link: int
    active: bool
    version: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuState:
    """One GPU as NVML reports it. Clocks in MHz, temperatures in °C, violation times in ns."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpulist: str | None = None
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    default_app_sm_clock_mhz: int | None = None
    clocks_event_mask: int | None = None
    clocks_event_reasons: tuple[str, ...] = ()
    thermal_violation_ns: int | None = None
    power_violation_ns: int | None = None
    # measured while a short matmul load runs on this GPU (None when no load was run)
    load_ms: float | None = None
    loaded_sm_clock_mhz: float | None = None
    loaded_clocks_event_mask: int | None = None
    loaded_clocks_event_reasons: tuple[str, ...] = ()  # every reason seen in any sample under load
    loaded_samples: int | None = None  # how many times NVML was read under load
    loaded_reason_samples: dict[str, int] = field(default_factory=dict)  # in how many samples each reason was
    loaded_sm_clock_min_mhz: int | None = None
    # growth of NVML's violation counters between the first and the last sample under load (ns), and the
    # time between those samples: thermal violation time under a load is thermal throttling, whatever the
    # reason bits showed at the instants sampled
    loaded_thermal_violation_ns: int | None = None
    loaded_power_violation_ns: int | None = None
    loaded_window_ms: float | None = None
    loaded_temperature_c: int | None = None
    loaded_pcie_gen: int | None = None
    ecc_enabled: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    nvlinks: tuple[NvLinkState, ...] = ()
    nvlink_speed_mbps: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_gpu_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_count: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"gpu{self.index}"

    @property
    def nvlinks_active(self) -> int:
        return sum(1 for link in self.nvlinks if link.active)


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuPair:
    """How two GPUs of one node reach each other (NVML indices a < b)."""

    a: int
    b: int
    common_ancestor: str | None = (
        None  # NVML_TOPOLOGY_*: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM
    )
    p2p_nvlink: str | None = None  # NVML_P2P_STATUS_* name for NVML_P2P_CAPS_INDEX_NVLINK: OK means NVLink
    p2p_read: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class IbPort:
    port: int
    state: str | None = None  # "ACTIVE", "DOWN", ... (sysfs "4: ACTIVE")
    phys_state: str | None = None  # "LinkUp", "Disabled", ...
    rate: str | None = None  # "400 Gb/sec (4X NDR)"
    rate_gbps: float | None = None
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"


@dataclass(frozen=True, kw_only=True, slots=True)
class PciAtomics:
    """PCIe AtomicOps as `lspci -vvv` prints them (DevCap2 AtomicOpsCap, DevCtl2 AtomicOpsCtl)."""

    cap: dict[str, bool] | None = None  # {"32bit": True, "64bit": True, "128bitCAS": True}
    ctl: dict[str, bool] | None = None  # {"ReqEn": True} (endpoints); {"EgressBlck": False} on ports
    access_denied: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class PciLink:
    cap_speed_gts: float | None = None
    cap_width: int | None = None
    sta_speed_gts: float | None = None
    sta_width: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class NicState:
    """An RDMA device from /sys/class/infiniband with its PCI function's facts."""

    name: str
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpulist: str | None = None
    ports: tuple[IbPort, ...] = ()
    atomics: PciAtomics | None = None
    pci_link: PciLink | None = None
    description: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class NumaNode:
    node: int
    cpulist: str


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthSnapshot:
    """Everything probed on one node at one moment. JSON-serialisable; snapshots of many nodes compare."""

    version: int = SNAPSHOT_VERSION
    host: str
    taken_at: str
    nvml_available: bool = False
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    gpus: tuple[GpuState, ...] = ()
    gpu_pairs: tuple[GpuPair, ...] = ()
    nics: tuple[NicState, ...] = ()
    numa_nodes: tuple[NumaNode, ...] = ()
    process_cpulist: str | None = None
    local_gpu: int | None = None  # the rank's GPU (NVML index) when a rank took the snapshot
    unavailable: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealthSnapshot:
        version = data.get("version", SNAPSHOT_VERSION)
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"health snapshot version {version} is not {SNAPSHOT_VERSION}")
        return _decode(cls, data)


T = TypeVar("T")


def _decode(cls: type[T], data: dict[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    kwargs = {f.name: _decode_value(hints[f.name], data[f.name]) for f in fields if f.name in data}
    return cls(**kwargs)


def _decode_value(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _decode_value(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode(tp, value)
    if origin is tuple:
        return tuple(_decode_value(args[0], v) for v in value)
    if origin is dict:
        return {k: _decode_value(args[1], v) for k, v in value.items()}
    return value
