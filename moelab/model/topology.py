"""A topology: nodes of GPUs, the links each GPU has, and where each link figure comes from.

Three link classes carry a rank's bytes (per GPU, per direction):
- `nvlink`: GPU to GPU inside a node; on PCIe-only nodes the peers talk over `pcie` instead;
- `pcie`: the GPU's own PCIe link. Every NIC byte crosses it (GPUDirect RDMA reads and writes GPU memory),
  and on PCIe-only nodes every peer byte too, so there the two share it;
- `nic`: this GPU's share of its node's NICs (`nics_per_node` NICs of `nic_gbps` each over `gpus_per_node`
  GPUs, traffic spread evenly over them, as rail-optimised fabrics and NCCL's PXN do).
A figure comes from the named table (moelab.model.links, datasheets), from a run's measured peaks, or from
a flag; each Link says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from moelab.core.errors import MoelabError
from moelab.model.links import PCIE_GEN5_X16, LinkPeak, PeakTable, link_rate_problem

DEFAULT_GPU = "H100"
DEFAULT_NIC = "ConnectX-7"


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    name: str  # nvlink | pcie | nic
    gbps: float  # per GPU and direction (nic: this GPU's share)
    source: str  # where the figure comes from


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    nodes: int
    gpus_per_node: int
    gpu: str
    intra: Link  # GPU to GPU inside a node: nvlink, or pcie on PCIe-only nodes
    host: Link  # the GPU's PCIe link
    nic: Link | None  # None on one node
    nic_name: str | None = None
    nics_per_node: int = 0

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def pcie_only(self) -> bool:
        return self.intra.name == "pcie"

    def links(self) -> list[Link]:
        """The links that carry bytes: the intra-node link, and across nodes the NIC and (NVLink nodes) the
        PCIe link it sits behind."""
        if self.nic is None:
            return [self.intra]
        return [self.intra, self.nic] if self.pcie_only else [self.intra, self.host, self.nic]

    def to_dict(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "world": self.world,
            "gpu": self.gpu,
            "pcie_only": self.pcie_only,
            "nic": self.nic_name,
            "nics_per_node": self.nics_per_node,
            "links": [{"name": k.name, "gbps": k.gbps, "source": k.source} for k in self.links()],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class TopologyRequest:
    """What a user gave (None: from the table or the defaults)."""

    nodes: int = 1
    gpus_per_node: int = 8
    gpu: str | None = None
    nic: str | None = None
    nics_per_node: int | None = None  # rails; default one NIC per GPU
    nvlink_gbps: float | None = None
    pcie_gbps: float | None = None
    nic_gbps: float | None = None  # per NIC
    pcie_only: bool = False
    measured_intra_gbps: float | None = None  # a run's measured link capacity per direction (the larger wins)
    measured_source: str = ""


def _check(req: TopologyRequest) -> None:
    for name, value in (
        ("--nodes", req.nodes),
        ("--gpus-per-node", req.gpus_per_node),
        ("--nics-per-node", req.nics_per_node),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise MoelabError(f"{name} must be a positive integer, got {value!r}")
    for name, figure in (
        ("--nvlink-gbps", req.nvlink_gbps),
        ("--pcie-gbps", req.pcie_gbps),
        ("--nic-gbps", req.nic_gbps),
    ):
        if figure is not None and (problem := link_rate_problem(figure)):
            raise MoelabError(f"{name} {problem}")
    if req.pcie_only and req.nvlink_gbps is not None:
        raise MoelabError(
            "--pcie-only and --nvlink-gbps contradict each other: PCIe-only nodes have no NVLink"
        )


def resolve(req: TopologyRequest, table: PeakTable) -> Topology:
    """The topology with every link figure resolved (measured, flag, then the named table), or one error line."""
    _check(req)
    gpu = req.gpu or DEFAULT_GPU
    entry = table.gpu(gpu)
    if entry is None and req.nvlink_gbps is None and not (req.pcie_only and req.pcie_gbps):
        known = ", ".join(sorted({e.pattern for e in table.gpus}))
        raise MoelabError(f"no link figures for GPU {gpu!r}: known GPUs are {known}; or give --nvlink-gbps")
    default = "" if req.gpu else " (default GPU)"
    if req.pcie_gbps:
        host = Link(name="pcie", gbps=req.pcie_gbps, source="flag --pcie-gbps")
    elif entry is not None:
        host = Link(
            name="pcie",
            gbps=entry.host_gbps,
            source=f"datasheet {entry.pattern}: {entry.datasheet_source or entry.source}{default}",
        )
    else:
        host = Link(name="pcie", gbps=PCIE_GEN5_X16, source="PCIe Gen5 x16 (PCI-SIG)")
    pcie_only = req.pcie_only or (entry is not None and entry.intra == "pcie" and req.nvlink_gbps is None)
    table_intra = _table_intra(req, entry, host, pcie_only, default)
    if req.measured_intra_gbps is not None and req.measured_intra_gbps > table_intra.gbps:
        kind = "pcie" if pcie_only else "nvlink"
        source = (
            f"{req.measured_source}, above the table's {table_intra.gbps:.0f} GB/s ({table_intra.source})"
        )
        intra = Link(name=kind, gbps=req.measured_intra_gbps, source=source)
    elif req.measured_intra_gbps is not None:
        # the larger of the measured figure and the table's rate, so the bound stays a bound
        source = f"{table_intra.source}; above the measured {req.measured_intra_gbps:.0f} GB/s ({req.measured_source})"
        intra = Link(name=table_intra.name, gbps=table_intra.gbps, source=source)
    else:
        intra = table_intra
    nic, nic_name, rails = _nic(req, table)
    return Topology(
        nodes=req.nodes,
        gpus_per_node=req.gpus_per_node,
        gpu=gpu,
        intra=intra,
        host=host,
        nic=nic,
        nic_name=nic_name,
        nics_per_node=rails,
    )


def _table_intra(
    req: TopologyRequest, entry: LinkPeak | None, host: Link, pcie_only: bool, default: str
) -> Link:
    """The intra-node link from a flag or the named table (its signalling rate, the larger: a bound)."""
    if pcie_only:
        return host
    if req.nvlink_gbps is not None:
        return Link(name="nvlink", gbps=req.nvlink_gbps, source="flag --nvlink-gbps")
    assert entry is not None
    source = f"table {entry.pattern}: {entry.link} ({entry.source}){default}"
    if entry.datasheet_gbps is not None and entry.datasheet_gbps != entry.gbps:
        source += (
            f"; the datasheet's {entry.datasheet_gbps:g} GB/s is lower: the bound takes the signalling rate"
        )
    return Link(name="nvlink", gbps=entry.gbps, source=source)


def _nic(req: TopologyRequest, table: PeakTable) -> tuple[Link | None, str | None, int]:
    """(this GPU's share of the NICs, the NIC's name, NICs per node)."""
    rails = req.nics_per_node or req.gpus_per_node
    if req.nodes == 1 and req.nic is None and req.nic_gbps is None:
        return None, None, rails
    name = req.nic or DEFAULT_NIC
    if req.nic_gbps is not None:
        per_nic, source = req.nic_gbps, "flag --nic-gbps"
    else:
        entry = table.nic(name)
        if entry is None:
            known = ", ".join(sorted(e.pattern for e in table.nics))
            raise MoelabError(f"no link figure for NIC {name!r}: known NICs are {known}; or give --nic-gbps")
        per_nic = entry.gbps
        source = (
            f"datasheet {entry.pattern}: {entry.link} ({entry.source}){'' if req.nic else ' (default NIC)'}"
        )
        if req.nics_per_node is None and entry.per_node is not None:
            rails = entry.per_node  # an instance kind's own NIC count (EFA)
    if rails != req.gpus_per_node:
        source += f"; {rails} NIC(s) per {req.gpus_per_node} GPUs"
    return Link(name="nic", gbps=per_nic * rails / req.gpus_per_node, source=source), name, rails
