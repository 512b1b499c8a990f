"""Measured NIC traffic: InfiniBand port counters from sysfs, sampled around a timed region.

Units. `port_xmit_data` / `port_rcv_data` count data octets divided by 4 (IBA PortXmitData/PortRcvData,
also mlx5's documentation; perfquery says the same). They are per port, not per lane: tools that
multiplied by the lane count (atop, an early node_exporter) were wrong. A few non-Mellanox drivers have
been reported to count octets (netdata #14747), so the word size is a parameter, stored with each result.

Width. Since Linux 4.5 the sysfs file shows the 64-bit PortCountersExtended value when the HCA has it
(every ConnectX); those do not wrap in practice. Old MLNX_OFED exposes the 64-bit value as
`counters_ext/port_*_data_64`, preferred when present. Otherwise the 32-bit legacy counter is shown: the
IBA spec makes it saturate at 2^32-1 (16 GiB of data; a third of a second at NDR), and some drivers wrap
it. So a value that goes down is corrected as one 32-bit wrap only while both readings fit in 32 bits
and the link rate x elapsed time proves that at most one wrap fits; a saturated or ambiguous counter
gives no bytes (None), never a guessed number. A port that is not ACTIVE at either end is marked;
a port that vanished has no bytes. A host without /sys/class/infiniband has no samples at all: None.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SYSFS_ROOT = Path("/sys/class/infiniband")
WORD_BYTES = 4
COUNTER32_MAX = (1 << 32) - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class IbPortSample:
    device: str  # e.g. mlx5_ib6
    port: int
    xmit_words: int | None  # None: unreadable
    rcv_words: int | None
    counter_bits: int | None  # 64 when read from counters_ext/*_64; None: the kernel chose (64 on ConnectX)
    state: str | None  # "ACTIVE", "DOWN", ... (from "4: ACTIVE")
    rate_gbps: float | None  # link rate in Gb/s (from "400 Gb/sec (4X NDR)")
    link_layer: str | None  # "InfiniBand" or "Ethernet" (RoCE)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass(frozen=True, kw_only=True, slots=True)
class IbSample:
    taken_s: float  # a monotonic clock, seconds
    ports: tuple[IbPortSample, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class IbPortDelta:
    device: str
    port: int
    status: str  # ok | not_active | vanished | appeared | saturated | ambiguous_wrap | reset
    xmit_bytes: int | None
    rcv_bytes: int | None
    xmit_gbps: float | None  # GB/s, 1e9 bytes
    rcv_gbps: float | None
    wrapped: bool  # a 32-bit wrap was corrected
    state_before: str | None
    state_after: str | None
    rate_gbps: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class IbDelta:
    elapsed_s: float
    word_bytes: int
    ports: tuple[IbPortDelta, ...]
    xmit_bytes: int  # over the ports whose bytes are known
    rcv_bytes: int
    xmit_gbps: float
    rcv_gbps: float
    unknown_ports: tuple[str, ...]  # ports without bytes: the totals are a lower bound when not empty

    @property
    def complete(self) -> bool:
        return not self.unknown_ports

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def _parse_state(text: str | None) -> str | None:
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


def _parse_rate(text: str | None) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def _port_sample(device: str, port_dir: Path) -> IbPortSample:
    ext = port_dir / "counters_ext"
    if (ext / "port_xmit_data_64").exists():
        xmit, rcv, bits = _read_int(ext / "port_xmit_data_64"), _read_int(ext / "port_rcv_data_64"), 64
    else:
        counters = port_dir / "counters"
        xmit, rcv, bits = _read_int(counters / "port_xmit_data"), _read_int(counters / "port_rcv_data"), None
    return IbPortSample(
        device=device,
        port=int(port_dir.name),
        xmit_words=xmit,
        rcv_words=rcv,
        counter_bits=bits,
        state=_parse_state(_read(port_dir / "state")),
        rate_gbps=_parse_rate(_read(port_dir / "rate")),
        link_layer=_read(port_dir / "link_layer"),
    )


def sample(root: Path = SYSFS_ROOT, clock: Callable[[], float] | None = None) -> IbSample | None:
    """Read every port's counters under `root`; None when the host has no InfiniBand/RDMA devices."""
    now = (clock or time.monotonic)()
    if not root.is_dir():
        return None
    ports = []
    for dev in sorted(root.iterdir(), key=lambda p: p.name):
        ports_dir = dev / "ports"
        if not ports_dir.is_dir():
            continue
        for port_dir in sorted(ports_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
            if port_dir.name.isdigit():
                ports.append(_port_sample(dev.name, port_dir))
    if not ports:
        return None
    return IbSample(taken_s=now, ports=tuple(ports))


def _counter_delta(
    before: int | None, after: int | None, bits: int | None, max_words: float | None
) -> tuple[int | None, str, bool]:
    """(words, status, wrapped) for one counter."""
    if before is None or after is None:
        return None, "vanished", False
    if bits != 64 and after == COUNTER32_MAX:
        return None, "saturated", False
    if after >= before:
        return after - before, "ok", False
    if bits != 64 and before <= COUNTER32_MAX:
        words = after + (1 << 32) - before
        if max_words is not None and max_words < (1 << 32):
            return words, "ok", True
        return None, "ambiguous_wrap", False
    return None, "reset", False


def _worse(a: str, b: str) -> str:
    order = ("vanished", "reset", "ambiguous_wrap", "saturated", "ok")
    return a if order.index(a) <= order.index(b) else b


def _port_delta(b: IbPortSample, a: IbPortSample | None, elapsed: float, word_bytes: int) -> IbPortDelta:
    """One port's bytes between two samples (`a` None: it vanished), judged against what its link could carry."""
    rate = (a.rate_gbps if a else None) or b.rate_gbps
    # words a link can carry in `elapsed` (rate in Gb/s of data), with 10% slack for clock error
    max_words = rate * 1e9 / 8 * elapsed * 1.1 / word_bytes if rate else None
    bits = b.counter_bits if a is None or a.counter_bits == b.counter_bits else None
    xw, xs, xwrap = _counter_delta(b.xmit_words, a.xmit_words if a else None, bits, max_words)
    rw, rs, rwrap = _counter_delta(b.rcv_words, a.rcv_words if a else None, bits, max_words)
    status = _worse(xs, rs)
    if status == "ok" and (b.state != "ACTIVE" or a is None or a.state != "ACTIVE"):
        status = "not_active"
    xb = xw * word_bytes if xw is not None else None
    rb = rw * word_bytes if rw is not None else None
    return IbPortDelta(
        device=b.device,
        port=b.port,
        status=status,
        xmit_bytes=xb,
        rcv_bytes=rb,
        xmit_gbps=xb / elapsed / 1e9 if xb is not None else None,
        rcv_gbps=rb / elapsed / 1e9 if rb is not None else None,
        wrapped=xwrap or rwrap,
        state_before=b.state,
        state_after=a.state if a else None,
        rate_gbps=rate,
    )


def delta(
    before: IbSample | None,
    after: IbSample | None,
    elapsed_s: float | None = None,
    word_bytes: int = WORD_BYTES,
) -> IbDelta | None:
    """Bytes and GB/s per port and in total between two samples; None when either side has no IB devices."""
    if before is None or after is None:
        return None
    elapsed = elapsed_s if elapsed_s is not None else after.taken_s - before.taken_s
    if elapsed <= 0:
        raise ValueError(f"elapsed time must be > 0, got {elapsed}")
    after_by_name = {p.name: p for p in after.ports}
    before_names = {p.name for p in before.ports}
    out = [_port_delta(b, after_by_name.get(b.name), elapsed, word_bytes) for b in before.ports]
    out += [
        IbPortDelta(
            device=a.device,
            port=a.port,
            status="appeared",
            xmit_bytes=None,
            rcv_bytes=None,
            xmit_gbps=None,
            rcv_gbps=None,
            wrapped=False,
            state_before=None,
            state_after=a.state,
            rate_gbps=a.rate_gbps,
        )
        for a in after.ports
        if a.name not in before_names
    ]
    xmit = sum(p.xmit_bytes for p in out if p.xmit_bytes is not None)
    rcv = sum(p.rcv_bytes for p in out if p.rcv_bytes is not None)
    unknown = tuple(f"{p.device}/{p.port}" for p in out if p.xmit_bytes is None or p.rcv_bytes is None)
    return IbDelta(
        elapsed_s=elapsed,
        word_bytes=word_bytes,
        ports=tuple(out),
        xmit_bytes=xmit,
        rcv_bytes=rcv,
        xmit_gbps=xmit / elapsed / 1e9,
        rcv_gbps=rcv / elapsed / 1e9,
        unknown_ports=unknown,
    )
