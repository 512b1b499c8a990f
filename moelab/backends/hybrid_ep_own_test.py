"""Hybrid-EP's own test, tests/test_hybrid_ep.py (branch hybrid-ep, 94a9f8f), as `moelab verify` runs it
beside the `hybrid-ep` backend: its command, its printout on rank 0 and the moelab figure each printed figure
must equal.

Per payload (BF16, then FP8) a `=== Torch API Benchmark (BF16, 2 ranks) ===` section with lines

    dispatch (BF16):    368.77 GB/s (NVL), t: 364.0 us [min=363.4, max=364.5], nvl_recv_bytes: 134.22 MB
    combine:            463.70 GB/s (NVL), t: 289.5 us [min=289.5, max=289.5], combine_send_bytes: 134.22 MB

(`_report_bw`: rank 0's bytes over the mean across ranks of each rank's mean time, cached handle: moelab's
`hybrid_ep_rank0_bytes_over_mean_time`), also dispatch+permute, combine+unpermute and their fused forms;
then a `=== Kernel Benchmark (...) ===` section of kernel-only (kineto) figures `label(NVL): X GB/s, avg_t=..`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from moelab.backends.deepep_own_tests import tree_python_env
from moelab.backends.deepep_rules import Shape, hybrid_ep_reason
from moelab.backends.library_test import (
    DEFAULT_MASTER_PORT,
    CommandContext,
    Comparison,
    LibraryCommand,
    LibraryTest,
    VerifyConfig,
)
from moelab.core.library_figures import LibraryFigure
from moelab.core.workload import Workload

TEST = "tests/test_hybrid_ep.py"
FIGURE = "hybrid_ep_rank0_bytes_over_mean_time"  # moelab's, computed as the test's (HybridEPBackend.library_figures)

_SECTION = re.compile(r"=== (Torch API|Kernel) Benchmark \((BF16|FP8), (\d+) ranks\) ===")
_API = re.compile(
    r"^(.+?):\s+([\d.]+) GB/s \((NVL|RDMA)\), t: ([\d.]+) us \[min=([\d.]+), max=([\d.]+)\](?:, (\w+): ([\d.]+) MB)?"
)
_KERNEL = re.compile(
    r"^(.+?)\((NVL|RDMA)\):\s+([\d.]+) GB/s, avg_t=([\d.]+) us \[min=([\d.]+), max=([\d.]+)\]"
)
_DTYPE_SUFFIX = re.compile(r"\s*\((BF16|FP8)\)\s*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridLine:
    label: str  # dispatch, combine, dispatch+permute, fused combine+unpermute, dispatch kernel, ...
    dtype: str  # the section's payload: bf16 | fp8
    timing: str  # api | kernel
    link: str  # NVL | RDMA
    gbps: float
    time_us: float
    mbytes: float | None
    line: str


def parse(text: str) -> list[HybridLine]:
    out: list[HybridLine] = []
    timing: str | None = None
    dtype: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _SECTION.search(line):
            timing, dtype = ("api" if m[1] == "Torch API" else "kernel"), m[2].lower()
            continue
        if timing is None or dtype is None:
            continue
        if timing == "api" and (m := _API.match(line)):
            out.append(
                HybridLine(
                    label=_DTYPE_SUFFIX.sub("", m[1]).strip(),
                    dtype=dtype,
                    timing="api",
                    link=m[3],
                    gbps=float(m[2]),
                    time_us=float(m[4]),
                    mbytes=float(m[8]) if m[8] else None,
                    line=line,
                )
            )
        elif timing == "kernel" and (m := _KERNEL.match(line)):
            out.append(
                HybridLine(
                    label=_DTYPE_SUFFIX.sub("", m[1].strip()).strip(),
                    dtype=dtype,
                    timing="kernel",
                    link=m[2],
                    gbps=float(m[3]),
                    time_us=float(m[4]),
                    mbytes=None,
                    line=line,
                )
            )
        elif line.startswith("==="):
            timing = dtype = None  # another section (e.g. a correctness check)
    return out


def figures(text: str) -> list[LibraryFigure]:
    """The API-timed NVL dispatch and combine figures per payload: what moelab's plain dispatch/combine time."""
    return [
        LibraryFigure(
            library="hybrid-ep",
            op=h.label,
            dtype=h.dtype,
            label=f"{h.label} ({h.dtype.upper()} run)",
            gbps=h.gbps,
            time_us=h.time_us,
            line=h.line,
        )
        for h in parse(text)
        if h.timing == "api" and h.link == "NVL" and h.label in ("dispatch", "combine")
    ]


HOST_BOUND_FACTOR = 2.0  # API time this many times the kernel time: the call is mostly host work


def host_bound_note(text: str, op: str, dtype: str) -> str | None:
    """Why a figure may not agree across processes: the library's API time of `op` is mostly host work
    (each plain dispatch synchronizes the host), by its own kernel-only line for the same op and payload.
    None when the log has no such pair or the kernel time dominates."""
    lines = parse(text)
    api = next((h for h in lines if h.timing == "api" and h.label == op and h.dtype == dtype), None)
    kernel = next(
        (h for h in lines if h.timing == "kernel" and h.label == f"{op} kernel" and h.dtype == dtype), None
    )
    if (
        api is None
        or kernel is None
        or kernel.time_us <= 0
        or api.time_us < HOST_BOUND_FACTOR * kernel.time_us
    ):
        return None
    return (
        f"host-bound: the library's {op} takes {api.time_us:g} us through its API but {kernel.time_us:g} us in "
        f"its kernel ({api.time_us / kernel.time_us:.1f}x), so the figure times per-call host work (a host "
        "sync inside each call), which varies between processes; +-5% agreement is not expected here"
    )


def hybrid_ep(
    tree: Path,
    wl: Workload,
    world: int,
    sms: int | None,
    python: str = sys.executable,
    master_port: int = DEFAULT_MASTER_PORT,
) -> LibraryCommand:
    """Hybrid-EP tests/test_hybrid_ep.py: the workload goes in the environment variables it reads at import
    (HIDDEN_DIM, NUM_TOKENS_PER_RANK, MAX_NUM_OF_TOKENS_PER_RANK, NUM_LOCAL_EXPERTS, TOPK; NUM_SMS_DISPATCH
    and NUM_SMS_COMBINE when moelab's case sets SMs, else the library's default); it runs BF16 then FP8."""
    env = tree_python_env(tree, master_port) | {
        "HIDDEN_DIM": str(wl.hidden),
        "NUM_TOKENS_PER_RANK": str(wl.tokens_per_rank),
        "MAX_NUM_OF_TOKENS_PER_RANK": str(wl.tokens_per_rank),
        "NUM_LOCAL_EXPERTS": str(wl.experts_per_rank),
        "TOPK": str(wl.topk),
    }
    if sms is not None:
        env |= {"NUM_SMS_DISPATCH": str(sms), "NUM_SMS_COMBINE": str(sms)}
    argv = (python, "test_hybrid_ep.py", "--num-processes", str(world))
    return LibraryCommand(
        library="hybrid-ep",
        test=TEST,
        argv=argv,
        cwd=str(tree / "tests"),
        env=env,
        log_name="hybrid_ep_test_hybrid_ep.log",
    )


class HybridEPTest(LibraryTest):
    """tests/test_hybrid_ep.py: its Torch API dispatch and combine lines, BF16 and FP8 runs, against moelab's
    `hybrid_ep_rank0_bytes_over_mean_time` (cached handle)."""

    test = TEST

    def case_sms(self, config: VerifyConfig) -> int | None:
        return config.sms  # passed as NUM_SMS_DISPATCH / NUM_SMS_COMBINE; None = both at defaults

    def unsupported_reason(self, config: VerifyConfig, world: int, gpus_per_node: int) -> str | None:
        """It always runs both payloads, whatever moelab asks."""
        for dtype in ("bf16", "fp8"):
            shape = Shape(
                hidden=config.hidden,
                topk=config.topk,
                tokens_per_rank=config.tokens_per_rank,
                experts_per_rank=config.experts_per_rank,
                dtype=dtype,
                world=world,
                gpus_per_node=gpus_per_node,
                sms=config.sms,
            )
            reason = hybrid_ep_reason(shape)
            if reason:
                return reason
        return None

    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        return [
            Comparison(op=op, library_dtype=d, moelab_dtype=d, figure=FIGURE)
            for d in self.case_dtypes(config)
            for op in ("dispatch", "combine")
        ]

    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        assert ctx.tree is not None
        wl, world = ctx.config.workload(), ctx.spec.launch.world
        return {"*": hybrid_ep(ctx.tree, wl, world, self.case_sms(ctx.config), master_port=ctx.master_port)}

    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        return figures(text)

    def failure_note(self, text: str, comparison: Comparison) -> str | None:
        return host_bound_note(text, comparison.op, comparison.library_dtype)


HYBRID_EP_TEST = HybridEPTest()
