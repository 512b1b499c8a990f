"""Host facts from sysfs and `lspci -vvv`: InfiniBand ports, PCI NUMA placement, PCIe AtomicOps, CPU sets.

Every reader takes the filesystem root as a parameter ("/" on a real host, a tmp tree in tests), and the
`lspci` text is parsed by a pure function, so recorded outputs replay exactly.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from moelab.health.model import IbPort, NicState, NumaNode, PciAtomics, PciLink
from moelab.job.sysfs import format_cpulist, normalize_bus_id, pci_numa, read_text, sys_root

LspciRunner = Callable[[Sequence[str]], str]


def numa_nodes(root: str | Path) -> tuple[NumaNode, ...]:
    """The host's NUMA nodes and their CPUs (/sys/devices/system/node/node*/cpulist)."""
    base = sys_root(root) / "devices" / "system" / "node"
    out = []
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = read_text(d / "cpulist")
        if cpulist is not None:
            out.append(NumaNode(node=int(d.name[4:]), cpulist=cpulist))
    return tuple(out)


def _after_colon(text: str | None) -> str | None:
    """sysfs "4: ACTIVE" → "ACTIVE"."""
    if text is None:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def parse_ib_rate(text: str | None) -> float | None:
    """sysfs rate "400 Gb/sec (4X NDR)" → 400.0."""
    if not text:
        return None
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def ib_devices(root: str | Path) -> tuple[NicState, ...]:
    """RDMA devices under /sys/class/infiniband: ports (state, phys_state, rate, link layer) and PCI placement."""
    base = sys_root(root) / "class" / "infiniband"
    nics = []
    for dev in sorted(base.glob("*")):
        ports = []
        for p in sorted((dev / "ports").glob("*"), key=lambda q: int(q.name) if q.name.isdigit() else 0):
            if not p.name.isdigit():
                continue
            rate = read_text(p / "rate")
            ports.append(
                IbPort(
                    port=int(p.name),
                    state=_after_colon(read_text(p / "state")),
                    phys_state=_after_colon(read_text(p / "phys_state")),
                    rate=rate,
                    rate_gbps=parse_ib_rate(rate),
                    link_layer=read_text(p / "link_layer"),
                )
            )
        bus_id: str | None = None
        device_link = dev / "device"
        if device_link.exists():
            try:
                bus_id = normalize_bus_id(device_link.resolve().name)
            except ValueError:
                bus_id = None
        node, cpulist = pci_numa(root, bus_id) if bus_id else (None, None)
        nics.append(
            NicState(name=dev.name, pci_bus_id=bus_id, numa_node=node, cpulist=cpulist, ports=tuple(ports))
        )
    return tuple(nics)


# ---- lspci -vvv -------------------------------------------------------------------------------------------

_HEADER = re.compile(r"^((?:[0-9a-fA-F]+:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(.*)$")
_FLAGS = re.compile(r"(\w+)([+-])")


def _flags(text: str) -> dict[str, bool]:
    return {name: sign == "+" for name, sign in _FLAGS.findall(text)}


def _speed(text: str) -> float | None:
    m = re.search(r"Speed\s+([0-9.]+)GT/s", text)
    return float(m.group(1)) if m else None


def _width(text: str) -> int | None:
    m = re.search(r"Width\s+x(\d+)", text)
    return int(m.group(1)) if m else None


def parse_lspci_vvv(text: str) -> dict[str, tuple[PciAtomics, PciLink, str]]:
    """`lspci -vvv` (with or without -D) → per bus id: AtomicOps capability/control, PCIe link, description.

    A device whose capabilities lspci could not read (not root: "Capabilities: <access denied>") gets
    `access_denied=True` and no atomics, so the rules say "unknown" rather than "missing".
    """
    out: dict[str, tuple[PciAtomics, PciLink, str]] = {}
    blocks: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m and not line[:1].isspace():
            blocks.append((normalize_bus_id(m.group(1)), m.group(2).strip(), []))
        elif blocks:
            blocks[-1][2].append(line.strip())
    for bus_id, description, lines in blocks:
        cap = ctl = None
        denied = False
        link = PciLink()
        for ln in lines:
            if "<access denied>" in ln:
                denied = True
            if ln.startswith("AtomicOpsCap:") or " AtomicOpsCap:" in ln:
                cap = _flags(ln.split("AtomicOpsCap:", 1)[1])
            if ln.startswith("AtomicOpsCtl:") or " AtomicOpsCtl:" in ln:
                ctl = _flags(ln.split("AtomicOpsCtl:", 1)[1])
            if ln.startswith("LnkCap:"):
                link = dataclasses.replace(link, cap_speed_gts=_speed(ln), cap_width=_width(ln))
            elif ln.startswith("LnkSta:"):
                link = dataclasses.replace(link, sta_speed_gts=_speed(ln), sta_width=_width(ln))
        out[bus_id] = (PciAtomics(cap=cap, ctl=ctl, access_denied=denied and cap is None), link, description)
    return out


def run_lspci(bus_ids: Sequence[str]) -> str:
    """`lspci -vvv -D -s BUS` for each bus id, concatenated. Raises OSError when lspci is not installed."""
    exe = shutil.which("lspci")
    if exe is None:
        raise OSError("lspci not found (install pciutils)")
    texts = []
    for b in bus_ids:
        proc = subprocess.run([exe, "-vvv", "-D", "-s", b], capture_output=True, text=True, timeout=30)
        texts.append(proc.stdout)
    return "\n".join(texts)


def with_pci_facts(nics: Sequence[NicState], lspci_text: str) -> tuple[NicState, ...]:
    """Attach lspci's AtomicOps and link facts to the NICs they belong to (by bus id)."""
    parsed = parse_lspci_vvv(lspci_text)
    out = []
    for nic in nics:
        facts = parsed.get(nic.pci_bus_id) if nic.pci_bus_id else None
        if facts is None:
            out.append(nic)
            continue
        atomics, link, description = facts
        out.append(dataclasses.replace(nic, atomics=atomics, pci_link=link, description=description))
    return tuple(out)


def process_cpulist(pid: int = 0) -> str | None:
    """The CPUs this process may run on (os.sched_getaffinity), as a cpulist; None where the OS has no such call."""
    getaff = getattr(os, "sched_getaffinity", None)
    if getaff is None:
        return None
    return format_cpulist(getaff(pid))
