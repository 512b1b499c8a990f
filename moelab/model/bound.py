"""The lower-bound time of dispatch and combine: each link class's bytes over its bandwidth, the slowest
(rank, link, direction) deciding, plus a latency term.

Links run concurrently and each direction of a link is its own resource (NVLink, PCIe and InfiniBand are
full duplex), so the bound is the largest of bytes / bandwidth over every rank, link and direction, not a
sum. Copies to the rank itself (HBM) are not bounded. Combine moves dispatch's rows back, in the combine
dtype (bf16 unless the backend quantizes it), so its sends are dispatch's receives.

The latency term is what the shortest path of a family costs with nothing to move: one kernel launch seen
by CUDA events (`launch_us`) plus one hop per link kind the path crosses in turn (`nvlink_hop_us`,
`pcie_hop_us`: a store and the flag the peer polls; `rdma_hop_us`: an RDMA write through one switch and its
completion). flat and low_latency cross one hop (the NIC when there are several nodes), hierarchical one
NIC hop then one NVLink hop. The figures are at the low end of what these steps take, so the bound stays a
bound; `--latency-us` replaces the whole term.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moelab.core.workload import payload_bytes_per_token
from moelab.model.topology import Topology
from moelab.model.traffic import FAMILIES, LinkRows, Traffic

OPS = ("dispatch", "combine")
LL_MESSAGE_HEADER_BYTES = (
    16  # DeepEP LL: an int4 of source info with each dispatch message (tests/test_low_latency.py)
)
COMBINE_DTYPES = ("bf16", "fp8", "mxfp8")

# byte definition -> (rows field of moelab.model.traffic, whether its bytes per row are the LL message's)
DEFINITION_ROWS: dict[str, tuple[str, bool]] = {
    "nvl_recv": ("recv_rows", False),
    "nvl_remote": ("recv_rows_remote", False),
    "rdma_pairs": ("rdma_pairs", False),
    "rdma_remote": ("rdma_pairs_remote", False),
    "algbw_send": ("send_rows", False),
    "ll_selections": ("selections", True),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Latency:
    launch_us: float = 2.0
    nvlink_hop_us: float = 1.0
    pcie_hop_us: float = 1.5
    rdma_hop_us: float = 2.0
    override_us: float | None = None  # --latency-us: the whole term, every family

    def family_us(self, family: str, topology: Topology) -> float:
        if self.override_us is not None:
            return self.override_us
        if topology.world == 1:
            return self.launch_us
        intra = self.pcie_hop_us if topology.pcie_only else self.nvlink_hop_us
        if topology.nodes == 1:
            return self.launch_us + intra
        if family == "hierarchical":
            return self.launch_us + self.rdma_hop_us + intra
        return self.launch_us + self.rdma_hop_us


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkLoad:
    link: str  # nvlink | pcie | nic
    direction: str  # send | recv
    bytes: float  # of the rank that needs longest on this link and direction
    gbps: float
    rank: int | None  # None: every rank alike (closed form)

    @property
    def time_us(self) -> float:
        return self.bytes / (self.gbps * 1e3)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    family: str
    op: str
    bytes_per_row: int  # payload per row (low_latency dispatch: per message, header included)
    loads: tuple[LinkLoad, ...]
    latency_us: float
    definitions: dict[str, float] = field(default_factory=dict)  # definition -> mean bytes per rank

    @property
    def transfer_us(self) -> float:
        return max((load.time_us for load in self.loads), default=0.0)

    @property
    def time_us(self) -> float:
        return self.transfer_us + self.latency_us

    @property
    def bottleneck(self) -> str:
        worst = max(self.loads, key=lambda load: load.time_us, default=None)
        if worst is None or worst.time_us <= 0:
            return "latency"
        return f"{worst.link} {worst.direction}"

    def gbps(self, definition: str) -> float:
        """The bound as a bandwidth in a stored definition: that definition's bytes over the bound time."""
        return self.definitions[definition] / (self.time_us * 1e3)

    def to_dict(self) -> dict[str, object]:
        return {
            "family": self.family,
            "op": self.op,
            "time_us": self.time_us,
            "transfer_us": self.transfer_us,
            "latency_us": self.latency_us,
            "bottleneck": self.bottleneck,
            "bytes_per_row": self.bytes_per_row,
            "links": [
                {
                    "link": x.link,
                    "direction": x.direction,
                    "bytes": x.bytes,
                    "gbps": x.gbps,
                    "time_us": x.time_us,
                    "rank": x.rank,
                }
                for x in self.loads
            ],
            "definitions": {d: {"bytes": b, "bound_gbps": self.gbps(d)} for d, b in self.definitions.items()},
        }


def bytes_per_row(family: str, op: str, hidden: int, dtype: str, combine_dtype: str = "bf16") -> int:
    """Dispatch rows carry the dispatch payload (low_latency: plus its message header), combine rows the
    combine dtype's."""
    if op == "combine":
        return payload_bytes_per_token(hidden, combine_dtype)
    extra = LL_MESSAGE_HEADER_BYTES if family == "low_latency" else 0
    return payload_bytes_per_token(hidden, dtype) + extra


def _rank_bytes(rows: LinkRows, topology: Topology, per_row: int) -> dict[tuple[str, str], float]:
    """Bytes on each (link, direction) of one rank in dispatch."""
    out: dict[tuple[str, str], float] = {}
    for direction, intra, nic in (
        ("send", rows.intra_send, rows.nic_send),
        ("recv", rows.intra_recv, rows.nic_recv),
    ):
        if topology.pcie_only:
            out[("pcie", direction)] = (intra + nic) * per_row
        else:
            out[("nvlink", direction)] = intra * per_row
            out[("pcie", direction)] = nic * per_row
        if topology.nic is not None:
            out[("nic", direction)] = nic * per_row
        elif nic:
            raise ValueError("rows cross nodes but the topology has no NIC")
    return out


def _gbps(topology: Topology, link: str) -> float:
    if link == "nic":
        assert topology.nic is not None
        return topology.nic.gbps
    if link == "pcie":
        return topology.intra.gbps if topology.pcie_only else topology.host.gbps
    return topology.intra.gbps


def bound(
    traffic: Traffic,
    topology: Topology,
    family: str,
    op: str,
    *,
    hidden: int,
    dtype: str,
    combine_dtype: str = "bf16",
    latency: Latency | None = None,
) -> Bound:
    """One family's bound for one op; every stored definition's bytes alongside (the low-latency one in
    that family's message bytes, whichever family this is)."""
    if family not in FAMILIES or op not in OPS:
        raise ValueError(f"unknown family {family!r} or op {op!r}")
    if traffic.world != topology.world or traffic.gpus_per_node != topology.gpus_per_node:
        raise ValueError("traffic and topology disagree on ranks or GPUs per node")
    message_bytes = bytes_per_row(family, op, hidden, dtype, combine_dtype)
    worst: dict[tuple[str, str], tuple[float, int | None]] = {}
    for rank in traffic.ranks:
        for (link, direction), nbytes in _rank_bytes(rank.families[family], topology, message_bytes).items():
            # combine sends what dispatch received and receives what it sent
            key = (link, direction if op == "dispatch" else {"send": "recv", "recv": "send"}[direction])
            if key not in worst or nbytes > worst[key][0]:
                worst[key] = (nbytes, rank.rank)
    loads = tuple(
        LinkLoad(link=link, direction=direction, bytes=b, gbps=_gbps(topology, link), rank=r)
        for (link, direction), (b, r) in sorted(worst.items())
    )
    per_row = bytes_per_row("flat", op, hidden, dtype, combine_dtype)
    ll_message = bytes_per_row("low_latency", op, hidden, dtype, combine_dtype)
    definitions = {
        name: traffic.mean(rows_field) * (ll_message if is_message else per_row)
        for name, (rows_field, is_message) in DEFINITION_ROWS.items()
    }
    return Bound(
        family=family,
        op=op,
        bytes_per_row=message_bytes,
        loads=loads,
        latency_us=(latency or Latency()).family_us(family, topology),
        definitions=definitions,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    traffic: Traffic
    topology: Topology
    bounds: tuple[Bound, ...]

    def get(self, family: str, op: str) -> Bound:
        return next(b for b in self.bounds if b.family == family and b.op == op)


def estimate(
    traffic: Traffic,
    topology: Topology,
    *,
    hidden: int,
    dtype: str,
    combine_dtype: str = "bf16",
    families: tuple[str, ...] = FAMILIES,
    latency: Latency | None = None,
) -> Estimate:
    """Every family's dispatch and combine bound for one workload's traffic on one topology."""
    bounds = tuple(
        bound(
            traffic,
            topology,
            family,
            op,
            hidden=hidden,
            dtype=dtype,
            combine_dtype=combine_dtype,
            latency=latency,
        )
        for family in families
        for op in OPS
    )
    return Estimate(traffic=traffic, topology=topology, bounds=bounds)


def stored_time_bound(est: Estimate, family: str, op: str) -> float | None:
    """The bound of a stored op: dispatch (with or without its layout) and combine by their own, roundtrip
    and the chained pair's period as both in turn; layout moves no payload and has none."""
    if op in ("dispatch", "dispatch_fresh", "combine"):
        return est.get(family, "combine" if op == "combine" else "dispatch").time_us
    if op in ("roundtrip", "pair"):
        return est.get(family, "dispatch").time_us + est.get(family, "combine").time_us
    return None
