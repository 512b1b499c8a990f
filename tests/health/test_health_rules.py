"""Health rules over recorded device states: healthy, throttled, ECC error, PCIe-only, no atomics, far NIC,
cross-node outliers, and a run whose after-snapshot throttles being marked suspect."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from moelab.health import rules
from moelab.health.model import Finding, GpuState, HealthSnapshot
from moelab.health.snapshot import diff, is_suspect, merge
from tests.fixtures.health.fake_nvml import recorded_snapshot


def by_check(findings: list[Finding], subject: str, check: str) -> Finding:
    matches = [f for f in findings if f.subject == subject and f.check == check]
    assert len(matches) == 1, (subject, check, findings)
    return matches[0]


def test_healthy_node_passes_every_check(tmp_path: Path) -> None:
    snap = recorded_snapshot(tmp_path, "healthy_h200x2", "dgx_h200x2", "cx7_h200x2")
    findings = rules.evaluate(snap)
    problems = [f for f in findings if f.status in ("warn", "fail")]
    # the only recorded blemish is mlx5_1 trained at 16 GT/s of 32 ("downgraded" in lspci)
    assert [(f.subject, f.check) for f in problems] == [("mlx5_1", "nic_pcie_link")]
    assert by_check(findings, "gpu0", "clock_under_load").status == "pass"
    assert by_check(findings, "gpu0-gpu1", "gpu_path").reason == "NVLink"
    assert "18 of 18" in by_check(findings, "gpu1", "nvlink").reason
    # Gen1 at idle is not a finding: under load the link ran at Gen5
    assert by_check(findings, "gpu0", "pcie_link").status == "pass"
    assert by_check(findings, "gpu1", "gpu_nic_numa").reason == "NUMA 1 shared with mlx5_1"
    assert rules.worst(findings) == "warn"
    assert all(f.source for f in findings)


def test_throttled_gpu_fails_by_nvbench_rule_and_nvml_reasons(tmp_path: Path) -> None:
    findings = rules.evaluate(recorded_snapshot(tmp_path, "throttled_h200x2", "dgx_h200x2", "cx7_h200x2"))
    clock = by_check(findings, "gpu1", "clock_under_load")
    assert clock.status == "fail"
    assert "1110 MHz" in clock.reason and "56%" in clock.reason and "hw_thermal_slowdown" in clock.reason
    assert "nvmlDeviceGetViolationStatus" in clock.source
    reasons = by_check(findings, "gpu1", "clocks_event_reasons")
    assert reasons.status == "fail"
    assert "hw_thermal_slowdown" in reasons.reason and "sw_thermal_slowdown" in reasons.reason
    assert by_check(findings, "gpu1", "temperature").status == "warn"
    assert by_check(findings, "gpu0", "clock_under_load").status == "pass"
    assert rules.worst(findings) == "fail"


@pytest.mark.parametrize(
    ("loaded_mhz", "loaded_reasons", "thermal_ns", "expected"),
    [
        (1485.0, (), None, "pass"),
        (1410.0, ("sw_power_cap",), 0, "pass"),  # a card at its power cap under full load: routine
        (1410.0, (), None, "warn"),  # slow with nothing to say why: a look, never a fail on its own
        (1900.0, ("sw_thermal_slowdown",), 0, "fail"),
        (1900.0, ("sw_power_cap",), 2_000_000, "fail"),  # thermal violation time under load
        (1900.0, ("sw_power_cap",), 999_999, "pass"),
        (1900.0, ("hw_slowdown",), None, "fail"),
        (None, (), None, "info"),
    ],
)
def test_throttling_is_judged_from_nvml_reasons_and_counters_not_one_clock_fraction(
    loaded_mhz: float | None, loaded_reasons: tuple[str, ...], thermal_ns: int | None, expected: str
) -> None:
    gpu = GpuState(
        index=0,
        max_sm_clock_mhz=1980,
        loaded_sm_clock_mhz=loaded_mhz,
        sm_clock_mhz=345,
        loaded_clocks_event_mask=0 if loaded_reasons else None,
        loaded_clocks_event_reasons=loaded_reasons,
        loaded_thermal_violation_ns=thermal_ns,
    )
    snap = HealthSnapshot(host="h", taken_at="t", nvml_available=True, gpus=(gpu,))
    assert by_check(rules.evaluate(snap), "gpu0", "clock_under_load").status == expected


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        (("gpu_idle",), "pass"),
        (("sw_power_cap",), "info"),
        (("sw_thermal_slowdown",), "fail"),
        (("board_limit",), "warn"),
        (("hw_slowdown",), "fail"),
        (("hw_power_brake_slowdown", "sw_power_cap"), "fail"),
    ],
)
def test_clock_event_reason_severity(reasons: tuple[str, ...], expected: str) -> None:
    gpu = GpuState(index=3, clocks_event_mask=1, clocks_event_reasons=reasons)
    snap = HealthSnapshot(host="h", taken_at="t", nvml_available=True, gpus=(gpu,))
    assert by_check(rules.evaluate(snap), "gpu3", "clocks_event_reasons").status == expected


def test_ecc_errors_fail_and_pending_remap_warns(tmp_path: Path) -> None:
    findings = rules.evaluate(recorded_snapshot(tmp_path, "ecc_error_h200x2"))
    ecc = by_check(findings, "gpu0", "ecc")
    assert ecc.status == "fail" and "2 uncorrectable" in ecc.reason
    assert by_check(findings, "gpu0", "remapped_rows").status == "warn"
    assert by_check(findings, "gpu1", "ecc").status == "pass"
    assert rules.worst(findings) == "fail"


def test_remap_failure_fails_and_lifetime_ecc_warns() -> None:
    gpu = GpuState(
        index=0,
        ecc_enabled=True,
        ecc_volatile_uncorrected=0,
        ecc_aggregate_uncorrected=5,
        remap_pending=True,
        remap_failure=True,
    )
    findings = rules.evaluate(HealthSnapshot(host="h", taken_at="t", nvml_available=True, gpus=(gpu,)))
    assert by_check(findings, "gpu0", "remapped_rows").status == "fail"
    assert by_check(findings, "gpu0", "ecc").status == "warn"


def test_pcie_only_pair_and_narrow_link_warn(tmp_path: Path) -> None:
    findings = rules.evaluate(recorded_snapshot(tmp_path, "pcie_only_h100x2"))
    path = by_check(findings, "gpu0-gpu1", "gpu_path")
    assert path.status == "warn"
    assert "PCIe only" in path.reason and "NODE" in path.reason and "with PCIe P2P" in path.reason
    link = by_check(findings, "gpu1", "pcie_link")
    assert link.status == "warn" and "x8 of x16" in link.reason
    assert by_check(findings, "gpu0", "pcie_link").status == "pass"
    assert by_check(findings, "gpu0", "nvlink").status == "info"


def test_pcie_gen_below_max_under_load_warns_but_idle_downshift_does_not() -> None:
    idle = GpuState(index=0, pcie_gen=1, pcie_gen_max=5, pcie_gen_gpu_max=5, pcie_width=16, pcie_width_max=16)
    loaded = dataclasses.replace(idle, loaded_pcie_gen=4)
    slot = dataclasses.replace(idle, pcie_gen_max=4, loaded_pcie_gen=4)
    for gpu, status, text in (
        (idle, "pass", "idle GPUs lower"),
        (loaded, "warn", "Gen4 under load"),
        (slot, "warn", "slot allows Gen4"),
    ):
        f = by_check(
            rules.evaluate(HealthSnapshot(host="h", taken_at="t", nvml_available=True, gpus=(gpu,))),
            "gpu0",
            "pcie_link",
        )
        assert f.status == status and text in f.reason


def test_nvlink_links_down_warn() -> None:
    from moelab.health.model import NvLinkState

    links = tuple(NvLinkState(link=i, active=i not in (3, 7), version=6) for i in range(18))
    gpu = GpuState(index=0, nvlinks=links)
    f = by_check(
        rules.evaluate(HealthSnapshot(host="h", taken_at="t", nvml_available=True, gpus=(gpu,))),
        "gpu0",
        "nvlink",
    )
    assert f.status == "warn" and "16 of 18" in f.reason and "3,7" in f.reason


def test_nic_without_atomics_warns_for_nvshmem(tmp_path: Path) -> None:
    findings = rules.evaluate(recorded_snapshot(tmp_path, "healthy_h200x2", "azure_ndv5", "azure_ndv5"))
    an0 = by_check(findings, "mlx5_an0", "pcie_atomics")
    assert an0.status == "warn"
    assert "NVSHMEM" in an0.reason and "32bit, 64bit, 128bitCAS" in an0.reason
    assert "docs.nvidia.com/nvshmem" in an0.source
    assert by_check(findings, "mlx5_ib0", "pcie_atomics").status == "pass"


def test_unreadable_atomics_are_unknown_not_missing(tmp_path: Path) -> None:
    findings = rules.evaluate(recorded_snapshot(tmp_path, "healthy_h200x2", "dgx_h200x2", "access_denied"))
    f = by_check(findings, "mlx5_0", "pcie_atomics")
    assert f.status == "info" and "root" in f.reason
    assert by_check(findings, "mlx5_1", "pcie_atomics").reason.startswith("AtomicOps unknown: no lspci facts")


def test_gpu_without_local_nic_and_down_port_warn(tmp_path: Path) -> None:
    findings = rules.evaluate(recorded_snapshot(tmp_path, "healthy_h200x2", "nic_far_h200x2", "cx7_h200x2"))
    far = by_check(findings, "gpu1", "gpu_nic_numa")
    assert far.status == "warn" and "NUMA node 1" in far.reason and "mlx5_0 (NUMA 0)" in far.reason
    assert by_check(findings, "gpu0", "gpu_nic_numa").status == "pass"
    assert by_check(findings, "mlx5_1/1", "ib_port").status == "warn"


def test_rank_affinity_outside_gpu_numa_warns(tmp_path: Path) -> None:
    snap = recorded_snapshot(tmp_path, "healthy_h200x2", "dgx_h200x2", local_gpu=1)
    inside = dataclasses.replace(snap, process_cpulist="48-59")
    outside = dataclasses.replace(snap, process_cpulist="0-11,48-59")
    assert by_check(rules.evaluate(inside), "gpu1", "cpu_affinity").status == "pass"
    f = by_check(rules.evaluate(outside), "gpu1", "cpu_affinity")
    assert f.status == "warn" and "12 CPUs outside" in f.reason and "--bind numa" in f.reason


def test_no_nvml_snapshot_says_so_and_passes(tmp_path: Path) -> None:
    snap = recorded_snapshot(tmp_path, "no_driver")
    findings = rules.evaluate(snap)
    nvml = by_check(findings, "host", "nvml")
    assert nvml.status == "info" and "Driver Not Loaded" in nvml.reason
    assert rules.worst(findings) == "info"


def test_cross_node_outliers_name_slowest_gpu_and_throttling_node(tmp_path: Path) -> None:
    good = recorded_snapshot(tmp_path, "healthy_h200x2", host="node-a")
    good2 = recorded_snapshot(tmp_path, "healthy_h200x2", host="node-b")
    sick = recorded_snapshot(tmp_path, "throttled_h200x2", host="node-c")
    findings = rules.compare_nodes([good, good2, sick])
    slowest = [f for f in findings if f.check == "slowest_gpu"]
    assert len(slowest) == 1
    assert (slowest[0].host, slowest[0].subject, slowest[0].status) == ("node-c", "gpu1", "warn")
    assert "1110 MHz (56% of its 1980 MHz max) vs median 100% over 6 GPUs" in slowest[0].reason
    nodes = [f for f in findings if f.check == "throttling_node"]
    assert [(f.host, f.status) for f in nodes] == [("node-c", "warn")]
    assert "1 of 2 GPUs" in nodes[0].reason


def test_cross_node_flags_mixed_hardware(tmp_path: Path) -> None:
    a = recorded_snapshot(tmp_path, "healthy_h200x2", host="a")
    b = recorded_snapshot(tmp_path, "pcie_only_h100x2", host="b")
    findings = rules.compare_nodes([a, b])
    models = [f for f in findings if f.check == "gpu_models"]
    assert len(models) == 1 and "NVIDIA H100 PCIe" in models[0].reason and models[0].status == "warn"
    # each at its own max clock (1980 and 1755 MHz): different models, but neither is slow
    assert [f.status for f in findings if f.check == "slowest_gpu"] == ["pass"]
    assert not [f for f in findings if f.check == "slow_gpu"]


def test_after_snapshot_that_throttles_marks_run_suspect(tmp_path: Path) -> None:
    before = recorded_snapshot(tmp_path, "healthy_h200x2", host="n")
    after = recorded_snapshot(tmp_path, "after_throttled_h200x2", host="n")
    found = diff(before, after)
    assert is_suspect(found)
    checks = {(f.subject, f.check): f for f in found}
    assert checks[("gpu1", "clock_under_load")].status == "fail"
    assert checks[("gpu1", "clock_under_load")].reason.startswith(
        "appeared during the run: throttled: 1200 MHz"
    )
    assert checks[("gpu1", "clocks_event_reasons")].status == "fail"
    assert "2500.0 ms" in checks[("gpu1", "thermal_violation")].reason
    assert "3 PCIe replays" in checks[("gpu1", "pcie_replays")].reason
    assert not [f for f in found if f.subject == "gpu0"]


def test_unchanged_node_is_not_suspect_even_when_already_unhealthy(tmp_path: Path) -> None:
    before = recorded_snapshot(tmp_path, "throttled_h200x2", host="n")
    after = recorded_snapshot(tmp_path, "throttled_h200x2", host="n")
    assert diff(before, after) == []
    assert not is_suspect(diff(before, after))
    healthy = recorded_snapshot(tmp_path, "healthy_h200x2", host="n")
    assert diff(healthy, healthy) == []


def test_new_ecc_errors_and_lost_links_during_run_fail(tmp_path: Path) -> None:
    from moelab.health.model import NvLinkState

    before = recorded_snapshot(tmp_path, "healthy_h200x2", host="n")
    g = before.gpus[0]
    worse = dataclasses.replace(
        g,
        ecc_volatile_uncorrected=1,
        nvlinks=tuple(NvLinkState(link=link.link, active=link.link != 0, version=6) for link in g.nvlinks),
    )
    after = dataclasses.replace(before, gpus=(worse, before.gpus[1]))
    found = {(f.check, f.status) for f in diff(before, after) if f.subject == "gpu0"}
    assert ("ecc_during_run", "fail") in found
    assert ("nvlink_during_run", "fail") in found
    assert ("ecc", "fail") in found


def test_require_healthy_refuses_a_failing_node(tmp_path: Path) -> None:
    from moelab.core.errors import MoelabError
    from moelab.health.snapshot import require_healthy

    assert require_healthy(recorded_snapshot(tmp_path, "healthy_h200x2"))
    with pytest.raises(
        MoelabError, match=r"node1 is not healthy: gpu1 clock_under_load: throttled: 1110 MHz"
    ):
        require_healthy(recorded_snapshot(tmp_path, "throttled_h200x2"))


def test_merge_reports_worst_over_nodes_and_is_json_ready(tmp_path: Path) -> None:
    import json

    report = merge(
        [
            recorded_snapshot(tmp_path, "healthy_h200x2", host="a"),
            recorded_snapshot(tmp_path, "ecc_error_h200x2", host="b"),
        ]
    )
    assert report["worst"] == "fail"
    assert {n["host"] for n in report["nodes"]} == {"a", "b"}
    assert any(f["host"] == "b" and f["check"] == "ecc" and f["status"] == "fail" for f in report["findings"])
    assert [f["check"] for f in report["cluster"]] == ["slowest_gpu"]
    json.dumps(report)


def test_every_source_is_public() -> None:
    """A finding cites what a reader can open (an API, a tool, a document's address), never a file of
    this project."""
    sources = {k: v for k, v in vars(rules).items() if k.startswith("SRC_")}
    assert len(sources) >= 10
    for name, text in sources.items():
        assert "seed" not in text.lower() and ".md" not in text and ".txt" not in text, name
    for name in ("SRC_TOPOLOGY", "SRC_ATOMICS", "SRC_NUMA", "SRC_AFFINITY", "SRC_OUTLIER"):
        assert "docs.nvidia.com" in sources[name] or ".com/" in sources[name] or ".io/" in sources[name], name
