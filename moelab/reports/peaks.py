"""Physical link peaks of known GPUs and NICs, per direction, in GB/s (1e9 bytes/s).

A measured bandwidth is read against the link that carries it: NVLink (or PCIe) for intranode traffic,
the NIC for internode traffic. The numbers are per GPU and per direction, the way DeepEP and nccl-tests
count a rank's bytes. A user TOML file can add or override entries (`--peaks FILE`):

    [gpu."H200"]            # matched case-insensitively as a substring of the GPU name
    link = "NVLink4 18 x 26.56 GB/s"
    gbps = 478.08

    [nic."ConnectX-7"]
    link = "NDR 400 Gb/s"
    gbps = 50.0

Longer patterns win, so "H100 PCIe" beats "H100".
"""

from __future__ import annotations

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


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkPeak:
    pattern: str  # substring of the device name that selects this entry
    link: str  # which link and how the figure is made
    gbps: float  # per direction, per GPU (or per NIC port)


def _gpu(pattern: str, link: str, gbps: float) -> LinkPeak:
    return LinkPeak(pattern=pattern, link=link, gbps=gbps)


BUILTIN_GPUS: tuple[LinkPeak, ...] = (
    _gpu("A100", "NVLink3 12 x 25 GB/s", 12 * 25.0),
    _gpu("A100-PCIE", "PCIe Gen4 x16", PCIE_GEN4_X16),
    _gpu("A100 PCIe", "PCIe Gen4 x16", PCIE_GEN4_X16),
    _gpu("A800", "NVLink3 8 x 25 GB/s", 8 * 25.0),
    _gpu("H100", "NVLink4 18 x 26.56 GB/s", 18 * 26.56),
    _gpu("H100 PCIe", "PCIe Gen5 x16", PCIE_GEN5_X16),
    _gpu("H100 NVL", "NVLink4 bridge 3 x 3 x 26.56 GB/s (pair)", 9 * 26.56),
    _gpu("H200", "NVLink4 18 x 26.56 GB/s", 18 * 26.56),
    _gpu("H200 NVL", "NVLink4 bridge 3 x 3 x 26.56 GB/s (pair)", 9 * 26.56),
    _gpu("H800", "NVLink4 8 x 26.56 GB/s", 8 * 26.56),
    _gpu("GH200", "NVLink4 18 x 26.56 GB/s", 18 * 26.56),
    _gpu("B200", "NVLink5 18 x 50 GB/s", 900.0),
    _gpu("GB200", "NVLink5 18 x 50 GB/s", 900.0),
    _gpu("B300", "NVLink5 18 x 50 GB/s", 900.0),
    _gpu("L40S", "PCIe Gen4 x16", PCIE_GEN4_X16),
)

BUILTIN_NICS: tuple[LinkPeak, ...] = (
    LinkPeak(pattern="ConnectX-6", link="HDR 200 Gb/s", gbps=25.0),
    LinkPeak(pattern="ConnectX-7", link="NDR 400 Gb/s", gbps=50.0),
    LinkPeak(pattern="ConnectX-8", link="XDR 800 Gb/s", gbps=100.0),
    LinkPeak(pattern="BlueField-3", link="NDR 400 Gb/s", gbps=50.0),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PeakTable:
    gpus: tuple[LinkPeak, ...] = BUILTIN_GPUS
    nics: tuple[LinkPeak, ...] = BUILTIN_NICS
    source: str = "built-in"
    overrides: tuple[str, ...] = field(default_factory=tuple)

    def gpu(self, name: str | None) -> LinkPeak | None:
        return _match(self.gpus, name)

    def nic(self, name: str | None) -> LinkPeak | None:
        return _match(self.nics, name)


def _match(entries: tuple[LinkPeak, ...], name: str | None) -> LinkPeak | None:
    if not name:
        return None
    lowered = name.lower()
    hits = [e for e in entries if e.pattern.lower() in lowered]
    return max(hits, key=lambda e: len(e.pattern)) if hits else None


def _entries(section: Any, kind: str, path: Path) -> list[LinkPeak]:
    if section is None:
        return []
    if not isinstance(section, dict):
        raise MoelabError(f"{path}: [{kind}] must be a table of named entries")
    out = []
    for pattern, body in section.items():
        if not isinstance(body, dict) or not isinstance(body.get("gbps"), int | float) or body["gbps"] <= 0:
            raise MoelabError(
                f"{path}: [{kind}.{pattern!r}] needs gbps = a positive number (GB/s per direction)"
            )
        out.append(
            LinkPeak(
                pattern=str(pattern), link=str(body.get("link", "user-defined")), gbps=float(body["gbps"])
            )
        )
    return out


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
