"""DeepEP V1's own tests, as `moelab verify` runs them beside the `deepep` and `deepep-ll` backends: their
commands, their printout (tag v1.2.1) and the moelab figure each printed figure must equal.

tests/test_intranode.py tunes at 24 SMs (`for i in (24, )`), over NVL chunk sizes, in the order FP8
dispatch (when SM90 features are compiled in), BF16 dispatch, combine; each ends with its `default` chunk
(`Buffer.get_dispatch_config` / `get_combine_config`, what a user gets) and then a `Best ...` summary:

    [tuning] SMs 24, NVL chunk 8: 331.52 GB/s (NVL), avg_t: 258.31 us
    [tuning] SMs 24, NVL chunk default: 332.16 GB/s (NVL), avg_t: 353.57 us
    [tuning] Best dispatch (BF16): SMs 24, NVL chunk 24, 332.48 GB/s (NVL), t: 353.22 us
    [tuning] Best combine: SMs 24, NVL chunk 8: 297.38 GB/s (NVL), t: 394.91 us

Figure = rank 0's received bytes (BF16: rows x hidden x 2; FP8: that x (1 + 4/128) / 2) over rank 0's mean
time after dropping the first of 50 iterations, cached handle: moelab's `deepep_nvl`. verify uses the
default-chunk lines: moelab runs DeepEP's recommended config, not the best of a tuning sweep.

tests/test_low_latency.py prints per rank `[rank R] Dispatch + combine bandwidth: X GB/s, avg_t=.. us, ...`
(events around FP8 dispatch + combine, every (token, expert) selection counted) and kernel-only
(kineto) per-op lines `[rank R] Dispatch bandwidth: X GB/s, avg_t=.. us | Combine bandwidth: ...`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from moelab.backends import deepep_rules
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

TEST_INTRANODE = "tests/test_intranode.py"
TEST_LOW_LATENCY = "tests/test_low_latency.py"
INTRANODE_SMS = 24  # test_intranode.py test_loop: `for i in (24, ):` the only SM count it runs
NVL_FIGURE = "deepep_nvl"  # moelab's figure computed as test_intranode.py's (DeepEPBackend.library_figures)
# figures verify derives itself, from moelab's samples and the library's own bytes (library GB/s x library
# time / moelab time): test_low_latency.py counts every (token, expert) selection, which moelab does not store
LL_PAIR_FIGURE = "deepep_ll_library_bytes_over_rank0_mean_time"
LL_KERNEL_FIGURE = "deepep_ll_library_bytes_over_kernel_time"

_TUNING = re.compile(r"\[tuning\] SMs (\d+), NVL chunk (\w+): ([\d.]+) GB/s \(NVL\), avg_t: ([\d.]+) us")
_BEST_DISPATCH = re.compile(
    r"\[tuning\] Best dispatch \((BF16|FP8)\): SMs (\d+), NVL chunk (\d+), ([\d.]+) GB/s \(NVL\), t: ([\d.]+) us"
)
_BEST_COMBINE = re.compile(
    r"\[tuning\] Best combine: SMs (\d+), NVL chunk (\d+): ([\d.]+) GB/s \(NVL\), t: ([\d.]+) us"
)
_LL_PAIR = re.compile(r"\[rank (\d+)\] Dispatch \+ combine bandwidth: ([\d.]+) GB/s, avg_t=([\d.]+) us")
_LL_KERNEL = re.compile(
    r"\[rank (\d+)\] Dispatch bandwidth: ([\d.]+) GB/s, avg_t=([\d.]+) us \| "
    r"Combine bandwidth: ([\d.]+) GB/s, avg_t=([\d.]+) us"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class TuningLine:
    """One line of test_intranode.py's tuning output."""

    op: str  # dispatch | combine
    dtype: str  # bf16 | fp8 (combine: bf16)
    sms: int
    nvl_chunk: str  # "4".."32" or "default"
    gbps: float
    time_us: float
    best: bool  # the `Best ...` summary line
    line: str


def parse_intranode(text: str) -> list[TuningLine]:
    """Every tuning line and Best summary, with the op and dtype each belongs to (known from the order of
    the phases, which the Best lines close)."""
    has_fp8 = "Best dispatch (FP8)" in text or "Running with FP8" in text
    phases = iter(([("dispatch", "fp8")] if has_fp8 else []) + [("dispatch", "bf16"), ("combine", "bf16")])
    op, dtype = next(phases)
    out: list[TuningLine] = []
    for raw in text.splitlines():
        line = raw.strip()
        if m := _BEST_DISPATCH.search(line):
            out.append(
                TuningLine(
                    op="dispatch",
                    dtype=m[1].lower(),
                    sms=int(m[2]),
                    nvl_chunk=m[3],
                    gbps=float(m[4]),
                    time_us=float(m[5]),
                    best=True,
                    line=line,
                )
            )
            op, dtype = next(phases, ("combine", "bf16"))
        elif m := _BEST_COMBINE.search(line):
            out.append(
                TuningLine(
                    op="combine",
                    dtype="bf16",
                    sms=int(m[1]),
                    nvl_chunk=m[2],
                    gbps=float(m[3]),
                    time_us=float(m[4]),
                    best=True,
                    line=line,
                )
            )
        elif m := _TUNING.search(line):
            out.append(
                TuningLine(
                    op=op,
                    dtype=dtype,
                    sms=int(m[1]),
                    nvl_chunk=m[2],
                    gbps=float(m[3]),
                    time_us=float(m[4]),
                    best=False,
                    line=line,
                )
            )
    return out


def intranode_figures(text: str) -> list[LibraryFigure]:
    """The default-chunk figures (one per op and dtype), not the best of the tuning sweep."""
    return [
        LibraryFigure(
            library="deepep",
            op=t.op,
            dtype=t.dtype,
            label=f"{t.op} {t.dtype.upper()}, SMs {t.sms}, NVL chunk default",
            gbps=t.gbps,
            time_us=t.time_us,
            line=t.line,
        )
        for t in parse_intranode(text)
        if t.nvl_chunk == "default" and not t.best
    ]


def low_latency_figures(text: str, rank: int = 0) -> list[LibraryFigure]:
    """Rank `rank`'s figures: the event-timed FP8 dispatch + combine pair, and the kernel-only per-op ones."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if (m := _LL_PAIR.search(line)) and int(m[1]) == rank:
            out.append(
                LibraryFigure(
                    library="deepep-ll",
                    op="pair",
                    dtype="fp8",
                    label="dispatch + combine (FP8 dispatch)",
                    gbps=float(m[2]),
                    time_us=float(m[3]),
                    line=line,
                )
            )
        elif (m := _LL_KERNEL.search(line)) and int(m[1]) == rank:
            out.append(
                LibraryFigure(
                    library="deepep-ll",
                    op="dispatch",
                    dtype="fp8",
                    label="dispatch kernel (FP8)",
                    gbps=float(m[2]),
                    time_us=float(m[3]),
                    timing="kernel",
                    line=line,
                )
            )
            out.append(
                LibraryFigure(
                    library="deepep-ll",
                    op="combine",
                    dtype="fp8",
                    label="combine kernel",
                    gbps=float(m[4]),
                    time_us=float(m[5]),
                    timing="kernel",
                    line=line,
                )
            )
    return out


# --- commands ---------------------------------------------------------------------------------------------


def tree_python_env(tree: Path, master_port: int) -> dict[str, str]:
    """PYTHONPATH with the library's tree first, as moelab's own job for that backend gets it, and the
    single-node settings the tests' utils.init_dist reads (it takes WORLD_SIZE and RANK as the node count
    and node rank, so values left by a launcher must not leak in; a free port avoids a port still held).
    Hybrid-EP's test, on a branch of DeepEP, reads the same."""
    paths = [str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": "1",
        "RANK": "0",
    }


def _workload_flags(wl: Workload, world: int) -> tuple[str, ...]:
    return (
        "--num-processes",
        str(world),
        "--num-tokens",
        str(wl.tokens_per_rank),
        "--hidden",
        str(wl.hidden),
        "--num-topk",
        str(wl.topk),
        "--num-experts",
        str(wl.num_experts(world)),
    )


def _deepep_test(
    tree: Path, wl: Workload, world: int, python: str, master_port: int, *, library: str, test: str
) -> LibraryCommand:
    """One of DeepEP V1's tests/test_*.py scripts, the workload in its flags."""
    return LibraryCommand(
        library=library,
        test=test,
        argv=(python, Path(test).name, *_workload_flags(wl, world)),
        cwd=str(tree / "tests"),
        env=tree_python_env(tree, master_port),
        log_name=f"deepep_{Path(test).stem}.log",
    )


def deepep_intranode(
    tree: Path, wl: Workload, world: int, python: str = sys.executable, master_port: int = DEFAULT_MASTER_PORT
) -> LibraryCommand:
    """DeepEP V1 tests/test_intranode.py: its flags carry the workload; it runs BF16 and FP8 dispatch and
    combine at 24 SMs whatever moelab's dtype (the SM count is fixed in the test)."""
    return _deepep_test(tree, wl, world, python, master_port, library="deepep", test=TEST_INTRANODE)


def deepep_low_latency(
    tree: Path, wl: Workload, world: int, python: str = sys.executable, master_port: int = DEFAULT_MASTER_PORT
) -> LibraryCommand:
    """DeepEP V1 tests/test_low_latency.py (no pressure test, NVLink allowed: its defaults)."""
    return _deepep_test(tree, wl, world, python, master_port, library="deepep-ll", test=TEST_LOW_LATENCY)


# --- the tests as verify runs them ------------------------------------------------------------------------


def _shape(
    config: VerifyConfig, dtype: str, sms: int | None, world: int, gpus_per_node: int
) -> deepep_rules.Shape:
    return deepep_rules.Shape(
        hidden=config.hidden,
        topk=config.topk,
        tokens_per_rank=config.tokens_per_rank,
        experts_per_rank=config.experts_per_rank,
        dtype=dtype,
        world=world,
        gpus_per_node=gpus_per_node,
        sms=sms,
    )


class IntranodeTest(LibraryTest):
    """tests/test_intranode.py: its default-chunk lines against moelab's `deepep_nvl` (cached handle)."""

    test = TEST_INTRANODE
    sms_note = f"DeepEP's intranode test runs {INTRANODE_SMS} only"

    def refuse(self, config: VerifyConfig) -> str | None:
        if config.sms not in (None, INTRANODE_SMS):
            return f"DeepEP's {TEST_INTRANODE} runs {INTRANODE_SMS} SMs only; give --sms {INTRANODE_SMS} or leave it out"
        return None

    def case_sms(self, config: VerifyConfig) -> int | None:
        return INTRANODE_SMS

    def unsupported_reason(self, config: VerifyConfig, world: int, gpus_per_node: int) -> str | None:
        """It always runs BF16 dispatch too, whatever moelab asks."""
        shapes = (_shape(config, d, INTRANODE_SMS, world, gpus_per_node) for d in ("bf16", *config.dtypes))
        return next((r for r in map(deepep_rules.v1_normal_reason, shapes) if r), None)

    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        dtypes = self.case_dtypes(config)
        combine_case = "bf16" if "bf16" in dtypes else dtypes[0]  # the test's combine line is BF16 only
        dispatch = [
            Comparison(op="dispatch", library_dtype=d, moelab_dtype=d, figure=NVL_FIGURE) for d in dtypes
        ]
        return dispatch + [
            Comparison(op="combine", library_dtype="bf16", moelab_dtype=combine_case, figure=NVL_FIGURE)
        ]

    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        assert ctx.tree is not None
        return {
            "*": deepep_intranode(
                ctx.tree, ctx.config.workload(), ctx.spec.launch.world, master_port=ctx.master_port
            )
        }

    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        return intranode_figures(text)


class LowLatencyTest(LibraryTest):
    """tests/test_low_latency.py (FP8 dispatch): rank 0's figures, whose bytes count every (token, expert)
    selection (which moelab does not store), over moelab's times."""

    test = TEST_LOW_LATENCY
    tree_from = "deepep"  # the same source tree
    by_default = False
    only_dtypes = ("fp8",)
    kernel_figures = True  # its per-op figures time the kernels alone
    definitions = {
        LL_PAIR_FIGURE: "DeepEP tests/test_low_latency.py 'Dispatch + combine bandwidth' bytes (every (token, expert) selection: FP8 "
        "dispatch + BF16 combine) over rank 0's mean time after dropping the first iteration of moelab's dispatch→combine pair op",
        LL_KERNEL_FIGURE: "DeepEP tests/test_low_latency.py kernel-only figure's bytes over moelab's kernel-only time of the op "
        "(--trace torch; moelab's is the slowest rank's, the test prints rank 0's)",
    }

    def unsupported_reason(self, config: VerifyConfig, world: int, gpus_per_node: int) -> str | None:
        return deepep_rules.v1_low_latency_reason(_shape(config, "fp8", None, world, gpus_per_node))

    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        def derived(op: str, figure: str, timing: str = "api", time_ops: tuple[str, ...] = ()) -> Comparison:
            return Comparison(
                op=op,
                library_dtype="fp8",
                moelab_dtype="fp8",
                figure=figure,
                timing=timing,
                moelab_side="library_bytes",
                time_ops=time_ops,
            )

        return [
            derived("pair", LL_PAIR_FIGURE, time_ops=("roundtrip", "pair")),
            # the low-latency dispatch is timed whole: its kernels are those of moelab's dispatch_fresh
            derived("dispatch", LL_KERNEL_FIGURE, timing="kernel", time_ops=("dispatch_fresh",)),
            derived("combine", LL_KERNEL_FIGURE, timing="kernel"),
        ]

    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        assert ctx.tree is not None
        return {
            "*": deepep_low_latency(
                ctx.tree, ctx.config.workload(), ctx.spec.launch.world, master_port=ctx.master_port
            )
        }

    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        return low_latency_figures(text)


INTRANODE_TEST = IntranodeTest()
LOW_LATENCY_TEST = LowLatencyTest()
