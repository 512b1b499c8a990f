"""`torch-symm-a2a`: dispatch/combine over torch symmetric memory, split sizes on the GPU, no host sync.

The torch-native baseline for EP libraries: `torch.ops.symm_mem.all_to_all_vdev(input, out, in_splits,
out_splits_offsets, group_name)` (torch >= 2.9 with NVSHMEM) takes the per-rank row counts as a device
tensor and exchanges them itself, so nothing waits for the host and the whole dispatch/combine can be
captured in a CUDA graph.

layout (local, no communication): which ranks each token goes to, the send order (by destination rank,
then token), the gather/scatter indices and the per-row metadata (local expert ids, weights), all padded
to the worst case of tokens x world rows (moelab.backends.symm_layout).
dispatch: copy the send counts and metadata into symmetric buffers, gather the token rows into the send
buffer (payload and metadata share each row, so one exchange carries both), one all_to_all_vdev. The
receive buffer is sized for the worst case; the received count stays on the device
(moelab.backends.padded.PaddedDispatched), and rows past it are marked expert -1.
combine: copy expert outputs into a symmetric buffer (the op reads only symmetric memory), one
all_to_all_vdev back with the received counts as splits, index_add at the source.
No SM control: the op picks its own block count (torch reads an environment variable for it, which moelab
does not set). NVLink multicast is not used by this op.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig, Placement
from moelab.backends.capabilities import ChainedPairs
from moelab.backends.padded import PaddedDispatched
from moelab.backends.symm_layout import (
    SPARE_ROWS,
    RowLayout,
    SymmLayout,
    buffer_rows,
    empty_meta,
    exchange_align_cols,
    mask_received_meta,
    meta_ids,
    meta_weights,
    plan_layout,
    sum_at_source,
)

OP_ARGS = ("input", "out", "in_splits", "out_splits_offsets", "group_name")


def op_signature_problem(arg_names: Sequence[str]) -> str | None:
    """None when all_to_all_vdev has the signature this backend calls, else what differs."""
    if tuple(arg_names) == OP_ARGS:
        return None
    return f"all_to_all_vdev takes ({', '.join(arg_names)}), this backend calls ({', '.join(OP_ARGS)})"


def _symm_mem_problem() -> str | None:
    """Why torch symmetric memory cannot run all_to_all_vdev here, or None. Loads no kernel."""
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as exc:
        return f"torch {torch.__version__} has no torch.distributed._symmetric_memory: {exc}"
    op = getattr(torch.ops.symm_mem, "all_to_all_vdev", None) if hasattr(torch.ops, "symm_mem") else None
    if op is None:
        return f"torch {torch.__version__} has no torch.ops.symm_mem.all_to_all_vdev (needs torch >= 2.9)"
    problem = op_signature_problem([a.name for a in op.default._schema.arguments])
    if problem:
        return f"torch {torch.__version__}: {problem}"
    if not torch.cuda.is_available():
        return "no CUDA GPU (all_to_all_vdev runs on NVSHMEM over CUDA devices)"
    if not symm_mem.is_nvshmem_available():
        return (
            f"NVSHMEM not usable by torch {torch.__version__}: libnvshmem_host.so.3 does not load "
            "(pip install nvidia-nvshmem-cu13, or a torch built with NVSHMEM)"
        )
    return None


@dataclass(slots=True)
class SymmBuffers:
    """Symmetric tensors for one (capacity, row layout): allocated and rendezvoused collectively."""

    send: torch.Tensor  # [capacity, width] bf16
    recv: torch.Tensor
    back_send: torch.Tensor  # [capacity, hidden_cols] bf16, combine's input and output
    back_recv: torch.Tensor
    in_splits: torch.Tensor  # [world] int64
    out_splits_offsets: torch.Tensor  # [2, world] int64
    back_in_splits: torch.Tensor
    back_out_splits_offsets: torch.Tensor
    recv_meta: torch.Tensor  # [capacity, 2*topk] int32, received metadata with padding rows masked
    combined: torch.Tensor  # [tokens + SPARE_ROWS, hidden] bf16, combine's sum
    row_ids: torch.Tensor  # [capacity] int64 arange, to mark the padding rows
    meta_fill: torch.Tensor  # [1, 2*topk] int32, metadata of a padding row
    rows: RowLayout


@dataclass(frozen=True, slots=True)
class SymmHandle:
    layout: SymmLayout
    recv_counts: torch.Tensor  # [world] int64 rows received from each source in this dispatch
    buffers: SymmBuffers


class TorchSymmA2ABackend(Backend, ChainedPairs):
    name = "torch-symm-a2a"
    # one set of symmetric buffers per case (self._current): received rows are views of `recv` (seen on
    # 4xH200: the tbo layer's output error 1 on every rank, serial correct)
    reused_receive_buffer = "one symmetric recv buffer per case, reused by every dispatch"
    dispatch_family = "flat"
    dispatch_family_source = (
        "torch symmetric memory all_to_all_vdev: each rank writes each peer's rows into its buffer directly"
    )
    description = "torch symmetric memory all_to_all_vdev (NVSHMEM): device-side splits, no host sync"
    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control = None
    phases: ClassVar[bool] = True

    @classmethod
    def availability(cls) -> str | None:
        return _symm_mem_problem()

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        import torch.distributed._symmetric_memory as symm_mem

        self._symm_mem = symm_mem
        get_backend = getattr(symm_mem, "get_backend", lambda device: None)
        if hasattr(symm_mem, "set_backend") and get_backend(ctx.device) != "NVSHMEM":
            symm_mem.set_backend("NVSHMEM")  # all_to_all_vdev is an NVSHMEM op; set before any allocation
        self._group_name = ctx.group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # deprecated (a no-op) in newer torch
                enable(self._group_name)
        self._buffers: dict[tuple[int, int, int, int], SymmBuffers] = {}
        self._current: SymmBuffers | None = None
        self._experts_per_rank = 1

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        if case.knobs:
            return f"{cls.name}: unknown knob(s) {', '.join(sorted(case.knobs))} (it has none)"
        if case.workload.hidden % 2:
            return f"{cls.name}: hidden must be even (metadata is packed as 32-bit words), got {case.workload.hidden}"
        if where.world < 2:
            # torch's rendezvous asserts `global_ranks.size() > 1` (seen on one H100, torch 2.11)
            return f"{cls.name}: symmetric memory needs 2 or more ranks, this run has {where.world}"
        return super().planned_reason(case, where)

    def prepare(self, case: CaseConfig) -> None:
        wl = case.workload
        self._experts_per_rank = wl.experts_per_rank
        key = (wl.tokens_per_rank, wl.hidden, wl.topk, self.ctx.world)
        if key not in self._buffers:
            # one shape at a time: NVSHMEM's symmetric heap is fixed (1 GiB by default, NVSHMEM_SYMMETRIC_SIZE)
            self._buffers.clear()
            self._current = None
            rows = RowLayout(wl.hidden, wl.topk, exchange_align_cols(self.ctx.world))
            self._buffers[key] = self._allocate(wl.tokens_per_rank, rows)
        self._current = self._buffers[key]

    def _allocate(self, tokens: int, rows: RowLayout) -> SymmBuffers:
        """Collective (every rank prepares the same cases in the same order)."""
        world, dev = self.ctx.world, self.ctx.device
        capacity = buffer_rows(tokens * world, rows.back_width)  # >= tokens * world: the worst case

        def symm(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            t = self._symm_mem.empty(*shape, dtype=dtype, device=dev)
            self._symm_mem.rendezvous(t, self._group_name)
            return t

        bufs = SymmBuffers(
            send=symm(capacity, rows.width, dtype=torch.bfloat16),
            recv=symm(capacity, rows.width, dtype=torch.bfloat16),
            back_send=symm(capacity, rows.back_width, dtype=torch.bfloat16),
            back_recv=symm(capacity, rows.back_width, dtype=torch.bfloat16),
            in_splits=symm(world, dtype=torch.int64),
            out_splits_offsets=symm(2, world, dtype=torch.int64),
            back_in_splits=symm(world, dtype=torch.int64),
            back_out_splits_offsets=symm(2, world, dtype=torch.int64),
            recv_meta=torch.empty(capacity, 2 * rows.topk, dtype=torch.int32, device=dev),
            combined=torch.empty(tokens + SPARE_ROWS, rows.hidden, dtype=torch.bfloat16, device=dev),
            row_ids=torch.arange(capacity, device=dev),
            meta_fill=empty_meta(1, rows.topk, dev),
            rows=rows,
        )
        bufs.send.zero_()  # padding rows are sent nowhere, but keep them finite
        return bufs

    def _bufs(self) -> SymmBuffers:
        if self._current is None:
            raise RuntimeError(f"{self.name}: prepare(case) must run before dispatch")
        return self._current

    def host_sync_ops(self) -> dict[str, str]:
        return {}

    def host_sync_note(self) -> str:
        return "none (split sizes stay on the GPU; the correctness check reads the row count once, untimed)"

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> SymmLayout:
        bufs = self._bufs()
        return plan_layout(topk_idx, topk_weights, self.ctx.world, self._experts_per_rank, bufs.send.shape[0])

    def _exchange(
        self, send: torch.Tensor, recv: torch.Tensor, splits: torch.Tensor, so: torch.Tensor
    ) -> None:
        torch.ops.symm_mem.all_to_all_vdev(send, recv, splits, so, self._group_name)

    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        layout: SymmLayout | SymmHandle | None = None,
    ) -> PaddedDispatched:
        """`layout`: what layout() returned, or an earlier dispatch's handle of the same routing (the measure
        layer times the cached-layout dispatch along the checked dispatch's handle)."""
        bufs = self._bufs()
        if isinstance(layout, SymmHandle):
            layout = layout.layout
        lay = layout if layout is not None else self.layout(topk_idx, topk_weights)
        rows = bufs.rows
        bufs.in_splits.copy_(lay.send_counts)
        torch.index_select(x, 0, lay.gather_idx, out=rows.payload(bufs.send))
        rows.meta(bufs.send).copy_(lay.meta)
        self._exchange(bufs.send, bufs.recv, bufs.in_splits, bufs.out_splits_offsets)
        recv_counts = bufs.out_splits_offsets[0].clone()  # the handle outlives the next dispatch
        meta = mask_received_meta(
            rows.meta(bufs.recv), recv_counts, bufs.recv_meta, bufs.row_ids, bufs.meta_fill
        )
        return PaddedDispatched(
            recv_x=rows.payload(bufs.recv),
            recv_topk_idx=meta_ids(meta, rows.topk),
            recv_topk_weights=meta_weights(meta, rows.topk),
            handle=SymmHandle(lay, recv_counts, bufs),
            recv_counts=recv_counts,
        )

    def combine(self, expert_out: torch.Tensor, handle: SymmHandle) -> torch.Tensor:
        """expert_out: one row per received row, either the padded capacity or exactly the received rows."""
        bufs = handle.buffers
        hidden = bufs.rows.hidden
        bufs.back_in_splits.copy_(handle.recv_counts)
        bufs.back_send[: expert_out.shape[0], :hidden].copy_(expert_out)
        self._exchange(bufs.back_send, bufs.back_recv, bufs.back_in_splits, bufs.back_out_splits_offsets)
        return sum_at_source(bufs.back_recv[:, :hidden], handle.layout, bufs.combined)

    def close(self) -> None:
        self._buffers.clear()
        self._current = None

    def library_versions(self) -> dict[str, str]:
        versions = {"torch": str(torch.__version__)}
        try:
            from importlib.metadata import version

            versions["nvshmem"] = version("nvidia-nvshmem-cu13")
        except Exception:
            pass
        return versions

    def record(self, case: CaseConfig) -> dict[str, Any]:
        wl = case.workload
        rows = RowLayout(wl.hidden, wl.topk, exchange_align_cols(self.ctx.world))
        return {
            "op": "torch.ops.symm_mem.all_to_all_vdev",
            "symm_backend": "NVSHMEM",
            "row_bytes": 2 * rows.width,
            "capacity_rows": buffer_rows(wl.tokens_per_rank * self.ctx.world, rows.back_width),
        }
