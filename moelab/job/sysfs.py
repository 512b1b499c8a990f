"""What a process reads of where it runs (sysfs): CPU lists and a PCI function's NUMA node.

The rank side (`--bind numa`) and the health probes both read these; every reader takes the filesystem root
("/" on a real host, a tmp tree in tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Kernel cpulist ("0-3,8,10-11") → sorted CPU ids. An empty string is the empty set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """CPU ids → kernel cpulist, the inverse of parse_cpulist."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(bus_id: str) -> str:
    """NVML's "00000000:18:00.0", lspci's "18:00.0" and sysfs's "0000:18:00.0" → "0000:18:00.0"."""
    m = _BUS_ID.match(bus_id.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def sys_root(root: str | Path) -> Path:
    return Path(root) / "sys"


def pci_numa(root: str | Path, bus_id: str) -> tuple[int | None, str | None]:
    """A PCI function's NUMA node and local CPU list from /sys/bus/pci/devices/<bus>/; -1 (no NUMA) → None."""
    dev = sys_root(root) / "bus" / "pci" / "devices" / normalize_bus_id(bus_id)
    node_text = read_text(dev / "numa_node")
    node = int(node_text) if node_text not in (None, "") else None
    return (node if node is not None and node >= 0 else None), read_text(dev / "local_cpulist")
