"""The named link table keeps signalling and datasheet rates apart, each with its source, and knows EFA
(per-NIC rate, NICs per node) and AMD xGMI (moelab.model.links)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.model.links import PeakTable
from moelab.model.topology import TopologyRequest, resolve

TABLE = PeakTable()


@pytest.mark.parametrize(
    ("gpu", "signalling", "datasheet"),
    [("NVIDIA H100 80GB HBM3", 478.08, 450.0), ("NVIDIA H200", 478.08, 450.0), ("NVIDIA H800", 212.48, 200.0),
     ("NVIDIA B200", 900.0, 900.0), ("AMD Instinct MI300X", 448.0, 448.0)],
)  # fmt: skip
def test_signalling_and_datasheet_rates_are_separate_columns(
    gpu: str, signalling: float, datasheet: float
) -> None:
    entry = TABLE.gpu(gpu)
    assert entry is not None
    assert entry.gbps == pytest.approx(signalling) and entry.datasheet_gbps == pytest.approx(datasheet)
    assert entry.source and any(
        w in entry.datasheet_source.lower() for w in ("datasheet", "data sheet", "specifications")
    )
    if signalling != datasheet:  # the bound takes the larger, and says the datasheet's is lower
        assert entry.source != entry.datasheet_source and "signalling" in entry.source
        topo = resolve(TopologyRequest(gpu=gpu), TABLE)
        assert (
            topo.intra.gbps == pytest.approx(signalling)
            and f"datasheet's {datasheet:g} GB/s" in topo.intra.source
        )


def test_xgmi_entry_names_its_link() -> None:
    entry = TABLE.gpu("AMD Instinct MI300X")
    assert (
        entry is not None
        and entry.link.startswith("xGMI 7 x")
        and "Infinity Fabric" in entry.datasheet_source
    )


def test_nics_are_named_as_what_they_are() -> None:
    assert "InfiniBand NDR" in TABLE.nic("ConnectX-7").link  # type: ignore[union-attr]
    for name, per_nic, count in (("EFA p5", 12.5, 32), ("EFA p5en", 25.0, 16), ("EFA p6-b200", 50.0, 8)):
        nic = TABLE.nic(name)
        assert nic is not None and nic.pattern == name and (nic.gbps, nic.per_node) == (per_nic, count)
        assert "EFA" in nic.link and "ConnectX" not in nic.link and "aws.amazon.com" in nic.source


def test_an_efa_node_shares_its_nics_over_its_gpus_through_the_command() -> None:
    res = CliRunner().invoke(
        app, ["model", "--nodes", "2", "--gpu", "H200", "--nic", "EFA p5en", "--family", "flat", "--json"]
    )
    assert res.exit_code == 0, res.output
    topo = json.loads(res.stdout)["topology"]
    nic = next(k for k in topo["links"] if k["name"] == "nic")
    assert topo["nics_per_node"] == 16 and nic["gbps"] == pytest.approx(16 * 25.0 / 8)
    assert "16 NIC(s) per 8 GPUs" in nic["source"]
