"""Probes over recorded states: NVML through a fake pynvml, sysfs trees in tmp_path, recorded `lspci -vvv`;
JSON round trips; `--bind numa` resolution and application."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from moelab.core.errors import MoelabError
from moelab.health.model import HealthSnapshot
from moelab.health.nvml_probe import (
    CLOCKS_EVENT_REASONS,
    GpuIdentity,
    decode_clocks_event_reasons,
    nvml_const,
    probe_nvml,
)
from moelab.health.rules import evaluate
from moelab.health.snapshot import dumps, load_snapshots, loads, take_snapshot
from moelab.health.sysfs_probe import ib_devices, numa_nodes, parse_lspci_vvv
from moelab.job import numa as numa_bind
from moelab.job.sysfs import format_cpulist, normalize_bus_id, parse_cpulist
from tests.fixtures.health.fake_nvml import (
    CONSTANTS,
    FakeNvml,
    build_sysfs,
    fake_nvml,
    load_state,
    lspci_text,
    recorded_snapshot,
)

# ---- NVML names ---------------------------------------------------------------------------------------


def test_fake_constants_and_reason_bits_match_installed_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, value in CONSTANTS.items():
        assert nvml_const(pynvml, name) == value, (
            name
        )  # nvml_const: pynvml's NVML_P2P_CAPS_INDEX_READ is (0,)
    for const, bit, _ in CLOCKS_EVENT_REASONS:
        assert getattr(pynvml, const) == bit, const
    for fn in [n for n in dir(FakeNvml) if n.startswith("nvml")]:
        assert callable(getattr(pynvml, fn)), fn


def test_decode_clocks_event_reasons() -> None:
    assert decode_clocks_event_reasons(0) == ()
    assert decode_clocks_event_reasons(0x60) == ("sw_thermal_slowdown", "hw_thermal_slowdown")
    assert decode_clocks_event_reasons(0x1 | 0x8 | 0x80) == (
        "gpu_idle",
        "hw_slowdown",
        "hw_power_brake_slowdown",
    )
    assert decode_clocks_event_reasons(0x4 | 0x2000) == ("sw_power_cap", "bit0x2000")


# ---- NVML probe -----------------------------------------------------------------------------------------


def test_probe_nvml_reads_recorded_h200_node() -> None:
    nvml = fake_nvml("healthy_h200x2")
    report = probe_nvml(nvml, num_cpus=192, load=nvml.run_load, load_ms=300)
    assert report.available and report.driver_version == "580.95.05" and report.cuda_driver_version == 13000
    g0, g1 = report.gpus
    assert g1.pci_bus_id == "0000:2a:00.0" and g1.numa_node == 1 and g1.cpulist == "48-95,144-191"
    assert (g0.sm_clock_mhz, g0.max_sm_clock_mhz, g0.loaded_sm_clock_mhz) == (345, 1980, 1980.0)
    assert g0.clocks_event_reasons == ("gpu_idle",) and g0.loaded_clocks_event_mask == 0
    assert (g0.pcie_gen, g0.loaded_pcie_gen, g0.pcie_gen_max, g0.pcie_width) == (1, 5, 5, 16)
    assert g0.nvlinks_active == 18 and len(g0.nvlinks) == 18 and g0.nvlinks[0].version == 6
    assert g0.nvlink_speed_mbps == 26562 and g0.pcie_replay_count == 0
    assert g0.ecc_enabled and g0.ecc_volatile_uncorrected == 0 and g0.remap_pending is False
    assert g0.retired_pages_sbe is None and "Not Supported" in g0.unavailable["retired_pages"]
    assert g0.power_violation_ns == 81234000000 and g0.load_ms == 300
    (pair,) = report.pairs
    assert (pair.a, pair.b, pair.common_ancestor, pair.p2p_nvlink) == (0, 1, "SYSTEM", "OK")


def test_probe_nvml_pcie_only_pair() -> None:
    report = probe_nvml(fake_nvml("pcie_only_h100x2"), num_cpus=192)
    assert all(g.nvlinks == () and g.nvlink_speed_mbps is None for g in report.gpus)
    assert report.gpus[1].pcie_width == 8
    (pair,) = report.pairs
    assert (pair.common_ancestor, pair.p2p_nvlink, pair.p2p_read) == ("NODE", "NOT_SUPPORTED", "OK")
    assert all(g.loaded_sm_clock_mhz is None and g.load_ms is None for g in report.gpus)


def test_load_that_cannot_run_keeps_idle_facts() -> None:
    def broken(gpu: GpuIdentity, seconds: float, sample: object) -> list:
        raise RuntimeError(f"NVML GPU {gpu.nvml_index} is not visible to CUDA in this process")

    report = probe_nvml(fake_nvml("healthy_h200x2"), num_cpus=192, load=broken, load_ms=200)
    g = report.gpus[0]
    assert g.loaded_sm_clock_mhz is None and g.sm_clock_mhz == 345
    assert "not visible to CUDA" in g.unavailable["load"]


def test_probe_nvml_without_driver() -> None:
    report = probe_nvml(fake_nvml("no_driver"), num_cpus=4)
    assert not report.available and report.gpus == ()
    assert report.unavailable == {"nvml": "nvmlInit: Driver Not Loaded"}


def test_missing_nvml_function_is_recorded_not_raised() -> None:
    class OldNvml(FakeNvml):
        nvmlDeviceGetRemappedRows = None  # type: ignore[assignment]

    report = probe_nvml(OldNvml(load_state("healthy_h200x2")), num_cpus=192)
    g = report.gpus[0]
    assert g.remap_pending is None and "not in this nvidia-ml-py" in g.unavailable["remapped_rows"]


# ---- snapshot -------------------------------------------------------------------------------------------


def test_take_snapshot_without_nvml_or_nics(tmp_path: Path) -> None:
    snap = take_snapshot(nvml=None, sysfs_root=tmp_path, lspci=None, host="bare")
    assert not snap.nvml_available and snap.gpus == () and snap.nics == ()
    assert set(snap.unavailable) == {"nvml", "nics"}
    assert snap.process_cpulist == format_cpulist(os.sched_getaffinity(0))


def test_take_snapshot_on_this_machine_never_fails(tmp_path: Path) -> None:
    snap = take_snapshot(sysfs_root=tmp_path, lspci=None, load_ms=0)
    assert snap.nvml_available or "nvml" in snap.unavailable
    assert loads(dumps(snap)) == snap


def test_snapshot_in_a_child_process() -> None:
    from moelab.health.snapshot import take_snapshot_subprocess

    snap = take_snapshot_subprocess(load_ms=0, timeout_s=120)
    assert "probe" not in snap.unavailable, snap.unavailable
    assert snap.process_cpulist is not None
    broken = take_snapshot_subprocess(load_ms=0, python="/bin/false")
    assert broken.unavailable == {"probe": "health probe exited 1: no output"}
    (finding,) = [f for f in evaluate(broken) if f.check == "probe"]
    assert finding.status == "warn"


def test_lspci_failure_is_recorded(tmp_path: Path) -> None:
    build_sysfs(tmp_path, "dgx_h200x2")

    def no_lspci(bus_ids: object) -> str:
        raise OSError("lspci not found (install pciutils)")

    snap = take_snapshot(nvml=None, sysfs_root=tmp_path, lspci=no_lspci)
    assert snap.unavailable["lspci"] == "lspci not found (install pciutils)"
    assert [n.name for n in snap.nics] == ["mlx5_0", "mlx5_1"] and snap.nics[0].atomics is None


@pytest.mark.parametrize(
    ("nvml_state", "sysfs", "lspci"),
    [
        ("healthy_h200x2", "dgx_h200x2", "cx7_h200x2"),
        ("throttled_h200x2", "nic_far_h200x2", "cx7_h200x2"),
        ("ecc_error_h200x2", None, None),
        ("pcie_only_h100x2", "azure_ndv5", "azure_ndv5"),
        ("no_driver", None, None),
    ],
)
def test_snapshot_json_round_trip(
    tmp_path: Path, nvml_state: str, sysfs: str | None, lspci: str | None
) -> None:
    snap = recorded_snapshot(tmp_path, nvml_state, sysfs, lspci)
    assert loads(dumps(snap)) == snap
    assert load_snapshots({"nodes": [json.loads(dumps(snap))]}) == [snap]


def test_snapshot_version_is_checked() -> None:
    with pytest.raises(ValueError, match="version 99"):
        HealthSnapshot.from_dict({"version": 99, "host": "h", "taken_at": "t"})


def test_gpu_numa_filled_from_sysfs_when_nvml_lacks_it(tmp_path: Path) -> None:
    build_sysfs(tmp_path, "dgx_h200x2")
    state = load_state("healthy_h200x2")
    for g in state["gpus"]:
        g["numa_node"] = "NOT_SUPPORTED"
    snap = take_snapshot(nvml=FakeNvml(state), sysfs_root=tmp_path, lspci=None, num_cpus=192)
    assert [g.numa_node for g in snap.gpus] == [0, 1]


# ---- sysfs and lspci ------------------------------------------------------------------------------------


def test_ib_devices_from_sysfs_tree(tmp_path: Path) -> None:
    build_sysfs(tmp_path, "azure_ndv5")
    an0, ib0 = ib_devices(tmp_path)
    assert (ib0.name, ib0.pci_bus_id, ib0.numa_node, ib0.cpulist) == ("mlx5_ib0", "0108:00:00.0", 0, "0-47")
    (port,) = ib0.ports
    assert (port.port, port.state, port.phys_state, port.rate_gbps, port.link_layer) == (
        1,
        "ACTIVE",
        "LinkUp",
        400.0,
        "InfiniBand",
    )
    assert an0.numa_node is None and an0.ports[0].link_layer == "Ethernet"  # numa_node -1: no NUMA affinity
    assert [(n.node, n.cpulist) for n in numa_nodes(tmp_path)] == [(0, "0-47"), (1, "48-95")]


def test_parse_lspci_atomics_and_links() -> None:
    cx7 = parse_lspci_vvv(lspci_text("cx7_h200x2"))
    atomics, link, desc = cx7["0000:17:00.0"]
    assert atomics.cap == {"32bit": True, "64bit": True, "128bitCAS": True} and atomics.ctl == {"ReqEn": True}
    assert (link.cap_speed_gts, link.cap_width, link.sta_speed_gts, link.sta_width) == (32.0, 16, 32.0, 16)
    assert "ConnectX-7" in desc
    assert cx7["0000:29:00.0"][1].sta_speed_gts == 16.0
    azure = parse_lspci_vvv(lspci_text("azure_ndv5"))
    assert azure["14a7:00:02.0"][0].cap == {"32bit": False, "64bit": False, "128bitCAS": False}
    assert azure["14a7:00:02.0"][0].ctl == {"ReqEn": False}
    assert azure["0108:00:00.0"][0].cap == {"32bit": True, "64bit": True, "128bitCAS": True}
    denied = parse_lspci_vvv(lspci_text("access_denied"))["0000:17:00.0"][0]
    assert denied.access_denied and denied.cap is None


def test_parse_lspci_without_domain_and_seed_grep_line() -> None:
    text = "17:00.0 Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n\t\t\t AtomicOpsCap: 32bit+ 64bit- 128bitCAS-\n"
    atomics = parse_lspci_vvv(text)["0000:17:00.0"][0]
    assert atomics.cap == {"32bit": True, "64bit": False, "128bitCAS": False}


def test_normalize_bus_id() -> None:
    assert normalize_bus_id("00000000:2A:00.0") == "0000:2a:00.0"
    assert normalize_bus_id("18:00.0") == "0000:18:00.0"
    assert normalize_bus_id("14a7:00:02.0") == "14a7:00:02.0"
    with pytest.raises(ValueError):
        normalize_bus_id("GPU-1f2c")


@given(st.sets(st.integers(min_value=0, max_value=511), max_size=80))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == tuple(sorted(cpus))
    assert format_cpulist(parse_cpulist(text)) == text


def test_cpulist_examples() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpulist([48, 49, 50, 0, 95]) == "0,48-50,95"
    assert parse_cpulist("") == ()


# ---- --bind numa ----------------------------------------------------------------------------------------


def test_resolve_binding_from_nvml() -> None:
    b = numa_bind.resolve_binding(1, nvml=fake_nvml("healthy_h200x2"), num_cpus=192)
    assert (b.pci_bus_id, b.numa_node, b.cpulist, b.source) == ("0000:2a:00.0", 1, "48-95,144-191", "nvml")
    by_uuid = numa_bind.resolve_binding(
        7, uuid="GPU-1f2c6b1e-6a0d-3b8e-9d49-0c1f2a6e7b10", nvml=fake_nvml("healthy_h200x2"), num_cpus=192
    )
    assert by_uuid.pci_bus_id == "0000:18:00.0" and by_uuid.numa_node == 0


def test_resolve_binding_falls_back_to_sysfs(tmp_path: Path) -> None:
    build_sysfs(tmp_path, "dgx_h200x2")
    b = numa_bind.resolve_binding(1, pci_bus_id="00000000:2A:00.0", nvml=None, sysfs_root=tmp_path)
    assert (b.numa_node, b.cpulist, b.source) == (1, "48-95,144-191", "sysfs")
    state = load_state("healthy_h200x2")
    state["gpus"][1]["numa_node"] = "NOT_SUPPORTED"
    mixed = numa_bind.resolve_binding(1, nvml=FakeNvml(state), sysfs_root=tmp_path, num_cpus=192)
    assert (mixed.numa_node, mixed.source) == (1, "nvml+sysfs")
    with pytest.raises(MoelabError, match="Driver Not Loaded"):
        numa_bind.resolve_binding(0, nvml=fake_nvml("no_driver"), sysfs_root=tmp_path)


def test_apply_binding_intersects_allowed_cpus_and_records() -> None:
    binding = numa_bind.NumaBinding(
        gpu=1, pci_bus_id="0000:2a:00.0", numa_node=1, cpulist="48-95,144-191", source="nvml"
    )
    applied_to: list[set[int]] = []
    done = numa_bind.apply_binding(
        binding,
        get_affinity=lambda pid: set(range(0, 96)),  # e.g. a SLURM cgroup without the SMT siblings
        set_affinity=lambda pid, cpus: applied_to.append(set(cpus)),
        set_memory_node=lambda node: f"preferred node {node}",
    )
    assert applied_to == [set(range(48, 96))]
    assert done.to_dict() == {
        "gpu": 1,
        "pci_bus_id": "0000:2a:00.0",
        "numa_node": 1,
        "source": "nvml",
        "previous_cpulist": "0-95",
        "cpulist": "48-95",
        "memory_policy": "preferred node 1",
    }
    with pytest.raises(MoelabError, match="outside this process's allowed CPUs"):
        numa_bind.apply_binding(
            binding,
            get_affinity=lambda pid: {0, 1},
            set_affinity=lambda pid, cpus: None,
            set_memory_node=None,
        )


def test_apply_binding_for_real_with_current_cpus() -> None:
    import threading

    current = os.sched_getaffinity(0)
    stop = threading.Event()
    seen: list[set[int]] = []

    def other_thread() -> None:
        stop.wait(10)
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=other_thread)
    t.start()
    one = min(current)
    try:
        numa_bind.apply_binding(
            numa_bind.NumaBinding(gpu=0, pci_bus_id=None, numa_node=None, cpulist=str(one), source="test")
        )
        stop.set()
        t.join()
        assert seen == [{one}]  # the thread started before the binding follows it
    finally:
        numa_bind.set_process_affinity(0, current)
    binding = numa_bind.NumaBinding(
        gpu=0, pci_bus_id=None, numa_node=None, cpulist=format_cpulist(current), source="test"
    )
    done = numa_bind.apply_binding(binding)
    assert os.sched_getaffinity(0) == current
    assert done.cpulist == format_cpulist(current) and done.memory_policy == "not applied: NUMA node unknown"


# ---- on a GPU -------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_snapshot_with_load_on_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("pynvml")
    snap = take_snapshot(load_ms=300)
    assert snap.nvml_available and snap.gpus, snap.unavailable
    visible = {
        str(torch.cuda.get_device_properties(i).uuid).lower().removeprefix("gpu-")
        for i in range(torch.cuda.device_count())
    }
    loaded = [g for g in snap.gpus if (g.uuid or "").lower().removeprefix("gpu-") in visible]
    assert loaded and all(g.loaded_sm_clock_mhz and g.loaded_sm_clock_mhz > 0 for g in loaded), [
        g.unavailable for g in loaded
    ]
    assert loads(dumps(snap)) == snap
    binding = numa_bind.resolve_binding(0, uuid=numa_bind.cuda_uuid(0))
    assert binding.cpulist
