"""The bound's arithmetic (moelab.model.bound) and the topology's link figures (moelab.model.topology)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moelab.core.errors import MoelabError
from moelab.core.workload import RoutingSpec, Workload, payload_bytes_per_token
from moelab.model.bound import Latency, bound, bytes_per_row, estimate
from moelab.model.links import PCIE_GEN4_X16, PeakTable, load_peaks
from moelab.model.topology import TopologyRequest, resolve
from moelab.model.traffic import traffic

TABLE = PeakTable()
WL = Workload(hidden=4096, tokens_per_rank=1000, topk=8, experts_per_rank=4, dtype="bf16")


def test_one_node_flat_dispatch_is_remote_rows_over_nvlink_plus_latency() -> None:
    topo = resolve(TopologyRequest(nodes=1, gpus_per_node=8, gpu="H100"), TABLE)
    tr = traffic(WL, 8, 8)
    b = bound(tr, topo, "flat", "dispatch", hidden=4096, dtype="bf16")
    remote = tr.ranks[0].definitions["send_rows_remote"] * 4096 * 2
    assert b.time_us == pytest.approx(remote / (18 * 26.56 * 1e3) + 2.0 + 1.0)
    assert b.bottleneck in ("nvlink send", "nvlink recv") and b.latency_us == 3.0
    # in nvl_remote terms the bound is the link (less the latency's share); nvl_recv adds the own rows
    assert b.gbps("nvl_remote") < 18 * 26.56 < b.gbps("nvl_recv")


def test_hierarchical_on_one_node_is_flat() -> None:
    topo = resolve(TopologyRequest(nodes=1, gpus_per_node=4, gpu="H200"), TABLE)
    tr = traffic(Workload(routing=RoutingSpec(kind="zipf"), experts_per_rank=4, tokens_per_rank=200), 4, 4)
    for op in ("dispatch", "combine"):
        flat = bound(tr, topo, "flat", op, hidden=8192, dtype="bf16")
        hier = bound(tr, topo, "hierarchical", op, hidden=8192, dtype="bf16")
        assert flat.transfer_us == hier.transfer_us


def test_combine_sends_what_dispatch_received() -> None:
    """A hot expert's rank receives most in dispatch and sends most in combine."""
    wl = Workload(
        tokens_per_rank=300, topk=2, experts_per_rank=4, routing=RoutingSpec(kind="hot", hot_share=0.9)
    )
    topo = resolve(TopologyRequest(nodes=1, gpus_per_node=4, gpu="H100"), TABLE)
    tr = traffic(wl, 4, 4)
    d = {
        (x.link, x.direction): x for x in bound(tr, topo, "flat", "dispatch", hidden=8192, dtype="bf16").loads
    }
    c = {
        (x.link, x.direction): x for x in bound(tr, topo, "flat", "combine", hidden=8192, dtype="bf16").loads
    }
    assert d[("nvlink", "recv")].bytes > d[("nvlink", "send")].bytes
    assert c[("nvlink", "send")].bytes == d[("nvlink", "recv")].bytes
    assert c[("nvlink", "send")].rank == d[("nvlink", "recv")].rank


def test_pcie_only_nodes_share_the_gpu_link_with_the_nic() -> None:
    topo = resolve(TopologyRequest(nodes=2, gpus_per_node=4, gpu="L40S", nic="ConnectX-6"), TABLE)
    assert (
        topo.pcie_only
        and topo.intra.gbps == PCIE_GEN4_X16
        and [k.name for k in topo.links()] == ["pcie", "nic"]
    )
    tr = traffic(WL, 8, 4)
    b = bound(tr, topo, "flat", "dispatch", hidden=4096, dtype="bf16")
    rows = tr.ranks[0].families["flat"]
    pcie = next(x for x in b.loads if x.link == "pcie" and x.direction == "send")
    assert pcie.bytes == pytest.approx((rows.intra_send + rows.nic_send) * 4096 * 2)
    # an NVLink GPU forced PCIe-only takes its PCIe link for its peers
    forced = resolve(TopologyRequest(nodes=1, gpus_per_node=8, gpu="H100", pcie_only=True), TABLE)
    assert forced.pcie_only and forced.intra.gbps == pytest.approx(63.0, rel=1e-3)


def test_nic_share_and_host_link() -> None:
    """Two NICs for eight GPUs: each GPU gets a quarter of a NIC; NIC bytes also cross its PCIe link."""
    topo = resolve(
        TopologyRequest(nodes=2, gpus_per_node=8, gpu="A100", nic="ConnectX-7", nics_per_node=2), TABLE
    )
    assert topo.nic is not None and topo.nic.gbps == pytest.approx(50.0 * 2 / 8)
    assert "2 NIC(s) per 8 GPUs" in topo.nic.source
    assert topo.host.gbps == PCIE_GEN4_X16  # A100 SXM: Gen4 x16 to its NIC
    one_nic_each = resolve(TopologyRequest(nodes=2, gpus_per_node=8, gpu="A100", nic="ConnectX-7"), TABLE)
    b = bound(traffic(WL, 16, 8), one_nic_each, "hierarchical", "dispatch", hidden=4096, dtype="bf16")
    loads = {(x.link, x.direction): x for x in b.loads}
    assert loads[("pcie", "send")].bytes == loads[("nic", "send")].bytes
    assert loads[("pcie", "send")].time_us > loads[("nic", "send")].time_us  # a 400G NIC behind Gen4 x16


def test_latency_per_family_and_override() -> None:
    lat = Latency()
    one = resolve(TopologyRequest(nodes=1, gpus_per_node=8), TABLE)
    two = resolve(TopologyRequest(nodes=2, gpus_per_node=8), TABLE)
    single = resolve(TopologyRequest(nodes=1, gpus_per_node=1), TABLE)
    assert lat.family_us("flat", one) == lat.launch_us + lat.nvlink_hop_us
    assert lat.family_us("hierarchical", two) == lat.launch_us + lat.rdma_hop_us + lat.nvlink_hop_us
    assert lat.family_us("low_latency", two) == lat.launch_us + lat.rdma_hop_us
    assert lat.family_us("flat", single) == lat.launch_us
    assert Latency(override_us=0.0).family_us("hierarchical", two) == 0.0


def test_bytes_per_row() -> None:
    assert bytes_per_row("low_latency", "dispatch", 7168, "fp8") == 7168 + 7168 // 128 * 4 + 16
    assert bytes_per_row("hierarchical", "dispatch", 7168, "fp8") == payload_bytes_per_token(7168, "fp8")
    assert bytes_per_row("low_latency", "combine", 7168, "fp8") == 7168 * 2
    assert bytes_per_row("flat", "combine", 8192, "bf16", "mxfp8") == 8192 + 8192 // 32


def test_estimate_is_every_family_and_op() -> None:
    topo = resolve(TopologyRequest(nodes=2, gpus_per_node=8), TABLE)
    est = estimate(traffic(WL, 16, 8), topo, hidden=4096, dtype="bf16")
    assert [(b.family, b.op) for b in est.bounds] == [
        (f, op) for f in ("flat", "hierarchical", "low_latency") for op in ("dispatch", "combine")
    ]
    # across nodes, de-duplication moves fewer NIC bytes than a flat all-to-all
    nic = {
        b.family: max(x.bytes for x in b.loads if x.link == "nic") for b in est.bounds if b.op == "dispatch"
    }
    assert nic["hierarchical"] < nic["flat"] < nic["low_latency"]


@pytest.mark.parametrize(
    ("req", "needle"),
    [
        (TopologyRequest(gpu="Z9000"), "no link figures for GPU 'Z9000'"),
        (TopologyRequest(nodes=2, nic="Myrinet"), "no link figure for NIC 'Myrinet'"),
        (TopologyRequest(nodes=0), "--nodes must be a positive integer"),
        (TopologyRequest(nvlink_gbps=-1.0), "--nvlink-gbps must be a positive finite number"),
        (TopologyRequest(pcie_only=True, nvlink_gbps=100.0), "contradict"),
    ],
)
def test_topology_errors(req: TopologyRequest, needle: str) -> None:
    with pytest.raises(MoelabError, match=needle):
        resolve(req, TABLE)


def test_flags_and_measured_figures_say_where_they_come_from(tmp_path: Path) -> None:
    topo = resolve(TopologyRequest(gpu="Z9000", nvlink_gbps=123.0, nodes=2, nic_gbps=40.0), TABLE)
    assert (
        topo.intra.source == "flag --nvlink-gbps"
        and topo.nic is not None
        and topo.nic.source == "flag --nic-gbps"
    )
    measured = resolve(
        TopologyRequest(gpu="H200", measured_intra_gbps=305.0, measured_source="measured peer copy of run R"),
        TABLE,
    )
    # the larger of the measured figure and the table's rate, so the bound stays a bound
    assert (
        measured.intra.gbps == 478.08
        and "above the measured 305 GB/s (measured peer copy of run R)" in measured.intra.source
    )
    faster = resolve(
        TopologyRequest(gpu="H200", measured_intra_gbps=500.0, measured_source="measured exchange of run R"),
        TABLE,
    )
    assert faster.intra.gbps == 500.0 and faster.intra.source.startswith(
        "measured exchange of run R, above the table's 478"
    )
    f = tmp_path / "peaks.toml"
    f.write_text('[gpu."Z9000"]\nlink = "PCIe Gen4"\ngbps = 31.5\nintra = "pcie"\n')
    custom = resolve(TopologyRequest(gpu="Z9000"), load_peaks(f))
    assert custom.pcie_only and custom.intra.gbps == 31.5
    f.write_text('[gpu."Z9000"]\ngbps = 31.5\nintra = "copper"\n')
    with pytest.raises(MoelabError, match="intra must be one of nvlink, pcie"):
        load_peaks(f)
