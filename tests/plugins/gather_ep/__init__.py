"""`gather-ep`: an example backend in a package of its own, importing nothing of moelab but moelab.plugin.

It is timed whole (phases = False): one dispatch call computes the per-rank counts, exchanges them (a
host synchronisation: gloo and NCCL take split sizes on the host), then sends the rows and their routing.
moelab times it as ops dispatch_fresh, combine and roundtrip. Its library brings a benchmark of its own
(bench.py in its source tree, given with --backend-path gather-ep=DIR) whose dispatch is a fresh one, and
a tune space over its one knob. docs/plugins.md walks through it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from moelab.plugin import (
    Backend,
    BackendContext,
    CaseConfig,
    CommandContext,
    Comparison,
    Dispatched,
    Figure,
    Knobs,
    LibraryCommand,
    LibraryFigure,
    LibraryTest,
    RankRows,
    TuneSpace,
    VerifyConfig,
    Workload,
    knob,
)

FIGURE = "gather_ep_rank0_bytes_over_mean_time"
FIGURE_TEXT = (
    "gather-ep's own figure: rank 0's received bytes over rank 0's mean back-to-back fresh dispatch time"
)
HOST_SYNC = "the per-rank counts copied to the host (split sizes)"
_BENCH_LINE = re.compile(r"^<dispatch/(\w+)> ([\d.]+) GB/s in ([\d.]+) us$")


@dataclass(frozen=True, kw_only=True)
class GatherKnobs(Knobs):
    counts: str = knob(
        "all_to_all", "how the per-rank counts are exchanged", choices=("all_to_all", "all_gather")
    )


@dataclass(slots=True)
class Handle:
    send_tok: torch.Tensor  # [S] source token of each sent row, destination-major
    send_splits: list[int]
    recv_splits: list[int]
    num_tokens: int


class OwnBench(LibraryTest):
    """bench.py in the library's tree: its dispatch is a fresh one, so it is set beside dispatch_fresh."""

    test = "bench.py"

    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        return [
            Comparison(op="dispatch_fresh", library_dtype=d, moelab_dtype=d, figure=FIGURE)
            for d in config.dtypes
        ]

    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        assert ctx.tree is not None
        c, world = ctx.config, ctx.spec.launch.world
        sizes = {
            "--ranks": world,
            "--tokens": c.tokens_per_rank,
            "--hidden": c.hidden,
            "--topk": c.topk,
            "--experts": c.experts_per_rank * world,
        }
        argv = (
            sys.executable,
            "bench.py",
            *(str(a) for kv in sizes.items() for a in kv),
            "--dtypes",
            ",".join(c.dtypes),
        )
        cmd = LibraryCommand(
            library=ctx.backend, test=self.test, argv=argv, cwd=str(ctx.tree), log_name="gather_ep_bench.log"
        )
        return {"*": cmd}

    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        found = (_BENCH_LINE.match(line.strip()) for line in text.splitlines())
        return [
            LibraryFigure(
                library="gather-ep",
                op="dispatch_fresh",
                dtype=m[1],
                label=m[0],
                gbps=float(m[2]),
                time_us=float(m[3]),
                line=m[0],
            )
            for m in found
            if m
        ]


class CountsTuning(TuneSpace):
    def knob_variants(self, sms: int | None) -> list[dict[str, Any]]:
        return [{"counts": "all_to_all"}, {"counts": "all_gather"}]

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Workload) -> list[str]:
        return [f"gather-ep: GatherEP(counts={knobs.get('counts', 'all_to_all')!r})"]


class GatherBackend(Backend):
    name = "gather-ep"
    description = "example plugin: exact-split all_to_all, timed whole"
    knobs: ClassVar[type[Knobs]] = GatherKnobs
    library_test = OwnBench()
    tuning = CountsTuning()
    library_ops: ClassVar[tuple[str, ...]] = ("dispatch_fresh",)

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        self._experts_per_rank = 1
        self._counts = "all_to_all"

    def prepare(self, case: CaseConfig) -> None:
        self._experts_per_rank = case.workload.experts_per_rank
        self._counts = GatherKnobs.parse(case.knobs, self.name).counts

    def host_sync_ops(self) -> dict[str, str]:
        return {"dispatch_fresh": HOST_SYNC, "roundtrip": HOST_SYNC}

    def _recv_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        group, world, rank = self.ctx.group, self.ctx.world, self.ctx.rank
        if self._counts == "all_to_all":
            recv = torch.empty_like(send_counts)
            dist.all_to_all_single(recv, send_counts, group=group)
            return recv
        every = send_counts.new_empty(world * world)
        dist.all_gather_into_tensor(every, send_counts, group=group)
        return every.view(world, world)[:, rank].contiguous()

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        world, rank, epr, group = self.ctx.world, self.ctx.rank, self._experts_per_rank, self.ctx.group
        num_tokens, topk = topk_idx.shape
        in_rank = torch.zeros(num_tokens, world, dtype=torch.bool, device=x.device)
        in_rank.scatter_(1, topk_idx // epr, True)
        send_tok = in_rank.t().nonzero()[:, 1]  # (rank, token) pairs, rank-major
        send_counts = in_rank.sum(dim=0)
        send_splits, recv_splits = send_counts.tolist(), self._recv_counts(send_counts).tolist()
        recv_x = x.new_empty(sum(recv_splits), x.shape[1])
        dist.all_to_all_single(recv_x, x[send_tok].contiguous(), recv_splits, send_splits, group=group)
        meta = torch.cat([topk_idx, topk_weights.double().view(torch.int64)], dim=1)[send_tok].contiguous()
        recv_meta = meta.new_empty(recv_x.shape[0], 2 * topk)
        dist.all_to_all_single(recv_meta, meta, recv_splits, send_splits, group=group)
        idx, weights = recv_meta[:, :topk], recv_meta[:, topk:].view(torch.float64)
        local = idx // epr == rank
        recv_idx = torch.where(local, idx - rank * epr, torch.full_like(idx, -1))
        recv_weights = torch.where(local, weights, torch.zeros_like(weights)).to(topk_weights.dtype)
        return Dispatched(
            recv_x, recv_idx, recv_weights, Handle(send_tok, send_splits, recv_splits, num_tokens)
        )

    def combine(self, expert_out: torch.Tensor, handle: Handle) -> torch.Tensor:
        back = expert_out.new_empty(sum(handle.send_splits), expert_out.shape[1])
        dist.all_to_all_single(
            back, expert_out.contiguous(), handle.send_splits, handle.recv_splits, group=self.ctx.group
        )
        out = torch.zeros(handle.num_tokens, expert_out.shape[1], dtype=torch.float32, device=back.device)
        return out.index_add_(0, handle.send_tok, back.float()).to(expert_out.dtype)

    @classmethod
    def library_figures(
        cls, op: str, rows: Sequence[RankRows], bytes_per_row: int, samples_us: Sequence[Sequence[float]]
    ) -> list[Figure]:
        if op not in cls.library_ops or not rows:
            return []
        rank0 = float(rows[0].recv_rows * bytes_per_row)
        mean_us = sum(samples_us[0]) / len(samples_us[0])
        return [
            Figure(
                definition=FIGURE,
                bytes_mean=rank0,
                bytes_max=rank0,
                gbps=rank0 / mean_us / 1e3,
                text=FIGURE_TEXT,
            )
        ]
