"""The one named table of link figures: per GPU model its GPU-to-GPU link inside a node (NVLink, or PCIe on
PCIe-only cards) and its PCIe host link, per NIC model its port rate; per direction, in GB/s (1e9 bytes/s),
each with the datasheet it comes from.

A measured bandwidth is read against the link that carries it: NVLink (or PCIe) for intranode traffic,
the NIC for internode traffic. The numbers are per GPU and per direction, the way DeepEP and nccl-tests
count a rank's bytes. The roofline (moelab.model.bound) and the reports read this table; a user TOML file
adds or overrides entries (`--peaks FILE`):

    [gpu."H200"]            # matched case-insensitively as a substring of the GPU name
    link = "NVLink4 18 x 26.56 GB/s"
    gbps = 478.08
    host_gbps = 63.0        # optional: the GPU's PCIe link (default PCIe Gen5 x16)
    intra = "nvlink"        # optional: "pcie" for a card whose peers talk over PCIe

    [nic."ConnectX-7"]
    link = "NDR 400 Gb/s"
    gbps = 50.0

Longer patterns win, so "H100 PCIe" beats "H100".

What the machine reports comes first: `reported_link` turns NVML's reading of a GPU (its active NVLink links,
their version, their speed, its PCIe link; moelab.health's snapshot, stored with every run) into the link
peak of that GPU, NVLink when links are active, else PCIe. The named table is the fallback where NVML read
nothing, and says so.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab.core.errors import MoelabError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PCIE_GEN4_X16 = 16e9 * 16 * 128 / 130 / 8 / 1e9  # 31.5 GB/s: 16 GT/s per lane, 128b/130b encoding
PCIE_GEN5_X16 = 2 * PCIE_GEN4_X16  # 63.0 GB/s
PCIE_GEN6_X16 = 2 * PCIE_GEN5_X16  # 126.0 GB/s (PAM4, FLIT encoding counted as Gen5's, a slight overestimate)
NVLINK4_LINK = 26.56  # GB/s per link and direction: 2 x 53.125 Gb/s lanes (NVLink4 as 18 x 26.56 = 478 GB/s)
INTRA_KINDS = ("nvlink", "pcie")

NVLINK_SIGNALLING = "NVLink4 signalling: 2 lanes x 106.25 Gb/s raw per link and direction = 26.56 GB/s per link (NVSwitch and NVLink4 specifications)"
H100_SOURCE = "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): NVLink 900 GB/s bidirectional = 450 GB/s per direction, 18 NVLink4 links; PCIe Gen5"
H200_SOURCE = "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): NVLink 900 GB/s bidirectional = 450 GB/s per direction, 18 NVLink4 links; PCIe Gen5"
H800_SOURCE = "NVIDIA H800 SXM5 datasheet: NVLink 400 GB/s bidirectional = 200 GB/s per direction (8 NVLink4 links); PCIe Gen5"
A100_SOURCE = "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): NVLink 600 GB/s bidirectional = 300 GB/s per direction (12 NVLink3 links); PCIe Gen4"
BLACKWELL_SOURCE = "NVIDIA HGX B200/GB200/B300 specifications: NVLink5 1.8 TB/s bidirectional = 900 GB/s per direction (18 links)"
MI300_SOURCE = "AMD Instinct MI300X/MI325X data sheet (amd.com): 7 Infinity Fabric (xGMI) links, 128 GB/s bidirectional each, 896 GB/s aggregate peer-to-peer; PCIe Gen5 x16"
MI355_SOURCE = "AMD Instinct MI350X/MI355X data sheet (amd.com): 7 Infinity Fabric (xGMI) links, 153.6 GB/s bidirectional each, 1075 GB/s aggregate; PCIe Gen5 x16"
XGMI_SIGNALLING = (
    "xGMI (Infinity Fabric 4th gen) signalling: 16 lanes x 32 Gb/s per link and direction = 64 GB/s per link"
)
PCIE_SOURCE = "PCI-SIG base specification: x16 at 16 GT/s (Gen4) / 32 GT/s (Gen5), 128b/130b"
CX_SOURCE = "NVIDIA ConnectX / BlueField datasheets (nvidia.com/en-us/networking): port rate, one direction"
EFA_SOURCE = (
    "AWS EC2 accelerated computing instances (aws.amazon.com/ec2/instance-types/p5/, /p6/) and the EC2 user "
    "guide's network cards table: total EFA bandwidth over its network cards"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkPeak:
    """One GPU's (or NIC's) link figures. `gbps` is the rate the bound divides by: the signalling rate where
    the table has one (the larger: a bound must not be beaten), `datasheet_gbps` the vendor's headline figure
    per direction, each with its own source."""

    pattern: str  # substring of the device name that selects this entry
    link: str  # which link and how the figure is made
    gbps: float  # per direction, per GPU (or per NIC port): signalling rate, the bound's
    source: str = "user-defined"  # of gbps
    intra: str = "nvlink"  # "pcie": the GPU reaches its peers over PCIe only
    host_gbps: float = PCIE_GEN5_X16  # the GPU's PCIe link (NIC traffic crosses it: GPUDirect RDMA)
    datasheet_gbps: float | None = None  # the vendor's figure per direction, where it differs or is stated
    datasheet_source: str = ""
    per_node: int | None = None  # NICs: how many a node of this kind has (EFA instances), else one per GPU


def _gpu(
    pattern: str,
    link: str,
    gbps: float,
    source: str,
    host: float = PCIE_GEN5_X16,
    datasheet: float | None = None,
    signalling: str = "",
) -> LinkPeak:
    """`gbps` the signalling rate (`signalling` says how it is made, else the datasheet gives it),
    `datasheet` the datasheet's per-direction figure (the same as gbps unless given)."""
    return LinkPeak(
        pattern=pattern,
        link=link,
        gbps=gbps,
        source=signalling or source,
        host_gbps=host,
        datasheet_gbps=gbps if datasheet is None else datasheet,
        datasheet_source=source,
    )


def _pcie_gpu(pattern: str, gbps: float, source: str) -> LinkPeak:
    gen = "Gen4" if gbps == PCIE_GEN4_X16 else "Gen5"
    return LinkPeak(
        pattern=pattern,
        link=f"PCIe {gen} x16",
        gbps=gbps,
        source=PCIE_SOURCE,
        intra="pcie",
        host_gbps=gbps,
        datasheet_gbps=gbps,
        datasheet_source=source,
    )


def _nvlink4(pattern: str, links: int, source: str, datasheet: float, suffix: str = "") -> LinkPeak:
    return _gpu(
        pattern,
        f"NVLink4 {suffix}{links} x {NVLINK4_LINK} GB/s",
        links * NVLINK4_LINK,
        source,
        datasheet=datasheet,
        signalling=NVLINK_SIGNALLING,
    )


BUILTIN_GPUS: tuple[LinkPeak, ...] = (
    _gpu("A100", "NVLink3 12 x 25 GB/s", 12 * 25.0, A100_SOURCE, host=PCIE_GEN4_X16),
    _pcie_gpu("A100-PCIE", PCIE_GEN4_X16, A100_SOURCE),
    _pcie_gpu("A100 PCIe", PCIE_GEN4_X16, A100_SOURCE),
    _gpu(
        "A800",
        "NVLink3 8 x 25 GB/s",
        8 * 25.0,
        "NVIDIA A800 datasheet: NVLink 400 GB/s bidirectional = 200 GB/s per direction; PCIe Gen4",
        host=PCIE_GEN4_X16,
    ),
    _nvlink4("H100", 18, H100_SOURCE, 450.0),
    _pcie_gpu("H100 PCIe", PCIE_GEN5_X16, H100_SOURCE),
    _nvlink4("H100 NVL", 9, H100_SOURCE, 300.0, "bridge 3 x 3 = "),
    _nvlink4("H200", 18, H200_SOURCE, 450.0),
    _nvlink4("H200 NVL", 9, H200_SOURCE, 300.0, "bridge 3 x 3 = "),
    _nvlink4("H800", 8, H800_SOURCE, 200.0),
    _nvlink4(
        "GH200", 18, "NVIDIA GH200 datasheet: NVLink 900 GB/s bidirectional = 450 GB/s per direction", 450.0
    ),
    _gpu("B200", "NVLink5 18 x 50 GB/s", 900.0, BLACKWELL_SOURCE),
    _gpu("GB200", "NVLink5 18 x 50 GB/s", 900.0, BLACKWELL_SOURCE),
    _gpu("B300", "NVLink5 18 x 50 GB/s", 900.0, BLACKWELL_SOURCE + "; PCIe Gen6", host=PCIE_GEN6_X16),
    _gpu("GB300", "NVLink5 18 x 50 GB/s", 900.0, BLACKWELL_SOURCE + "; PCIe Gen6", host=PCIE_GEN6_X16),
    _pcie_gpu("L40S", PCIE_GEN4_X16, "NVIDIA L40S datasheet: PCIe Gen4 x16, no NVLink"),
    _gpu("MI300X", "xGMI 7 x 64 GB/s", 7 * 64.0, MI300_SOURCE, datasheet=448.0, signalling=XGMI_SIGNALLING),
    _gpu("MI325X", "xGMI 7 x 64 GB/s", 7 * 64.0, MI300_SOURCE, datasheet=448.0, signalling=XGMI_SIGNALLING),
    _gpu("MI355X", "xGMI 7 x 76.8 GB/s", 7 * 76.8, MI355_SOURCE, datasheet=537.6),
)


def _nic(pattern: str, link: str, gbps: float, source: str, per_node: int | None = None) -> LinkPeak:
    return LinkPeak(
        pattern=pattern,
        link=link,
        gbps=gbps,
        source=source,
        datasheet_gbps=gbps,
        datasheet_source=source,
        per_node=per_node,
    )


BUILTIN_NICS: tuple[LinkPeak, ...] = (
    _nic("ConnectX-6", "InfiniBand HDR 200 Gb/s", 25.0, CX_SOURCE),
    _nic("ConnectX-7", "InfiniBand NDR 400 Gb/s", 50.0, CX_SOURCE),
    _nic("ConnectX-8", "InfiniBand XDR 800 Gb/s", 100.0, CX_SOURCE),
    _nic("BlueField-3", "NDR 400 Gb/s", 50.0, CX_SOURCE),
    # AWS Elastic Fabric Adapter: per NIC (network card) and direction, NICs per node of the instance
    _nic("EFA p5", "EFAv2 32 x 100 Gb/s per p5.48xlarge (8 H100)", 12.5, EFA_SOURCE, per_node=32),
    _nic("EFA p5en", "EFAv3 16 x 200 Gb/s per p5en.48xlarge (8 H200)", 25.0, EFA_SOURCE, per_node=16),
    _nic("EFA p6-b200", "EFAv4 8 x 400 Gb/s per p6-b200.48xlarge (8 B200)", 50.0, EFA_SOURCE, per_node=8),
)


# NVLink per link and direction, GB/s, by generation (the datasheets above: P100 NVLink1 20 GB/s, V100
# NVLink2 and A100 NVLink3 25 GB/s, H100/H200 NVLink4 26.56 GB/s, Blackwell NVLink5 50 GB/s)
NVLINK_GBPS_PER_LINK: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: NVLINK4_LINK, 5: 50.0}
# nvmlDeviceGetNvLinkVersion returns nvmlNvlinkVersion_t (nvml.h): the code, not the generation
NVML_NVLINK_VERSIONS: dict[int, str] = {
    1: "1.0",
    2: "2.0",
    3: "2.2",
    4: "3.0",
    5: "3.1",
    6: "4.0",
    7: "5.0",
    8: "6.0",
}
PCIE_GTS: dict[int, float] = {3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}  # GT/s per lane (128b/130b from Gen3 on)


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkFacts:
    """What NVML reported of one GPU's links (moelab.health.model.GpuState's fields)."""

    nvlinks_active: int = 0
    nvlink_version: int | None = None  # nvmlNvlinkVersion_t code of the first active link
    nvlink_speed_mbps: float | None = None  # per link, as NVML reports it (MB/s)
    pcie_gen: int | None = None  # the link's maximum generation and width (not the idle, down-trained one)
    pcie_width: int | None = None


def pcie_gbps(gen: int, width: int) -> float | None:
    """One direction of a PCIe link: GT/s per lane x lanes x 128/130 / 8 bits (Gen6's FLIT counted alike)."""
    rate = PCIE_GTS.get(gen)
    return None if rate is None or width <= 0 else rate * width * 128 / 130 / 8


def nvlink_generation(version_code: int | None) -> int | None:
    name = NVML_NVLINK_VERSIONS.get(version_code) if version_code is not None else None
    return int(name.split(".")[0]) if name else None


def reported_link(facts: LinkFacts) -> LinkPeak | None:
    """The GPU's peer link as NVML reported it: its active NVLink links (count x per-link rate: NVML's speed
    where it gave a plausible one, else the generation's datasheet rate), else its PCIe link; None when NVML
    reported neither."""
    host = pcie_gbps(facts.pcie_gen, facts.pcie_width) if facts.pcie_gen and facts.pcie_width else None
    if facts.nvlinks_active > 0:
        gen = nvlink_generation(facts.nvlink_version)
        speed = (facts.nvlink_speed_mbps or 0) / 1e3
        measured = 5.0 <= speed <= 500.0  # GB/s per link: anything else is not a link rate
        per_link = speed if measured else NVLINK_GBPS_PER_LINK.get(gen or 0)
        if per_link is None:
            return None
        name = f"NVLink{gen}" if gen else "NVLink"
        how = "per-link rate from NVML" if measured else f"per-link rate from the {name} datasheet"
        version = NVML_NVLINK_VERSIONS.get(facts.nvlink_version or 0, "?")
        return LinkPeak(
            pattern="",
            link=f"{name} {facts.nvlinks_active} x {per_link:.2f} GB/s",
            gbps=facts.nvlinks_active * per_link,
            source=f"NVML: {facts.nvlinks_active} active NVLink links, version {version}; {how}",
            host_gbps=host or PCIE_GEN5_X16,
        )
    if host is None:
        return None
    return LinkPeak(
        pattern="",
        link=f"PCIe Gen{facts.pcie_gen} x{facts.pcie_width}",
        gbps=host,
        intra="pcie",
        host_gbps=host,
        source="NVML: no active NVLink link; the GPU's PCIe link (maximum generation and width)",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PeakTable:
    gpus: tuple[LinkPeak, ...] = BUILTIN_GPUS
    nics: tuple[LinkPeak, ...] = BUILTIN_NICS
    source: str = "built-in"
    overrides: tuple[str, ...] = field(default_factory=tuple)

    def gpu(self, name: str | None) -> LinkPeak | None:
        return _match(self.gpus, name)

    def user_gpu(self, name: str | None) -> LinkPeak | None:
        """The entry of a user peaks file that names this GPU (it wins over what NVML reported)."""
        hit = self.gpu(name)
        return hit if hit is not None and hit.pattern in self.overrides else None

    def nic(self, name: str | None) -> LinkPeak | None:
        return _match(self.nics, name)


def _match(entries: tuple[LinkPeak, ...], name: str | None) -> LinkPeak | None:
    if not name:
        return None
    lowered = name.lower()
    hits = [e for e in entries if e.pattern.lower() in lowered]
    return max(hits, key=lambda e: len(e.pattern)) if hits else None


# the link rates a bound may divide by, GB/s per direction: 1 MB/s to 1 PB/s. Past them a figure is a typo
# (`1e-300` made every bound a 295-digit number of seconds, `inf` made it zero)
LINK_GBPS_RANGE = (1e-3, 1e6)


def link_rate_problem(value: Any) -> str | None:
    """Why `value` is no link rate (GB/s per direction), or None when it is one."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        return f"must be a positive finite number (GB/s per direction), got {value!r}"
    low, high = LINK_GBPS_RANGE
    if not low <= value <= high:
        return f"must be between {low:g} and {high:,.0f} GB/s per direction, got {value:g}"
    return None


ENTRY_KEYS = ("gbps", "host_gbps", "intra", "link")


def _entry(kind: str, pattern: str, body: Any, path: Path) -> LinkPeak:
    where = f"{path}: [{kind}.{pattern!r}]"
    if not isinstance(body, dict) or "gbps" not in body:
        raise MoelabError(f"{where} needs gbps = a positive finite number (GB/s per direction)")
    if problem := link_rate_problem(body["gbps"]):
        raise MoelabError(f"{where}: gbps {problem}")
    unknown = sorted(set(body) - set(ENTRY_KEYS))
    if unknown:  # a misspelt `host_gpbs` or a `pcie_gbps` would be ignored, the table's figure used instead
        raise MoelabError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(ENTRY_KEYS)})")
    if "host_gbps" in body and (problem := link_rate_problem(body["host_gbps"])):
        raise MoelabError(f"{where}: host_gbps {problem}")
    intra = body.get("intra", "nvlink")
    if intra not in INTRA_KINDS:
        raise MoelabError(f"{where}: intra must be one of {', '.join(INTRA_KINDS)}, got {intra!r}")
    gbps = float(body["gbps"])
    return LinkPeak(
        pattern=str(pattern),
        link=str(body.get("link", "user-defined")),
        gbps=gbps,
        source=str(path),
        intra=intra,
        host_gbps=float(body.get("host_gbps", gbps if intra == "pcie" else PCIE_GEN5_X16)),
    )


def _entries(section: Any, kind: str, path: Path) -> list[LinkPeak]:
    if section is None:
        return []
    if not isinstance(section, dict):
        raise MoelabError(f"{path}: [{kind}] must be a table of named entries")
    return [_entry(kind, pattern, body, path) for pattern, body in section.items()]


def _merge(base: tuple[LinkPeak, ...], extra: list[LinkPeak]) -> tuple[LinkPeak, ...]:
    replaced = {e.pattern.lower() for e in extra}
    return tuple(e for e in base if e.pattern.lower() not in replaced) + tuple(extra)


def load_peaks(path: Path | None = None) -> PeakTable:
    """The built-in table, with the entries of a user TOML file added or replacing built-in ones."""
    if path is None:
        return PeakTable()
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise MoelabError(f"cannot read peaks file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise MoelabError(f"{path} is not valid TOML: {exc}") from exc
    unknown = set(doc) - {"gpu", "nic"}
    if unknown:
        raise MoelabError(
            f'{path}: unknown section(s) {", ".join(sorted(unknown))}; use [gpu."NAME"] and [nic."NAME"]'
        )
    gpus, nics = _entries(doc.get("gpu"), "gpu", path), _entries(doc.get("nic"), "nic", path)
    return PeakTable(
        gpus=_merge(BUILTIN_GPUS, gpus),
        nics=_merge(BUILTIN_NICS, nics),
        source=str(path),
        overrides=tuple(e.pattern for e in gpus + nics),
    )
