"""What each overlapped schedule of the e2e layer needs from a backend, asked before any kernel runs, and
the expert groups of the expert-chunked schedule.

Schedules (moelab.core.e2e_spec: `mode` x `comm`):
- `tbo` / `chunked`: token micro-batches, one's communication under another's expert compute;
- `expert`: expert-chunked pipelining. The local experts of every rank are split into `chunks` groups
  (group g: local ids [g*E/G, (g+1)*E/G)); each group is dispatched with the routing masked to its
  experts (-1 elsewhere), so group g+1's dispatch and group g-1's combine run under group g's GEMMs. Every
  expert still sees all its rows (a token split, by contrast, halves the rows of each expert's GEMM); the
  price is that a token with experts in several groups of one rank crosses the wire once per group. The
  layer's output is the sum of the groups' combines. Needs MaskedRouting.
- `columns`: hidden-column pipelining of the layer's tail. The batch is dispatched and its first GEMM and
  activation run whole; the second GEMM, the un-permute and the combine run in `chunks` slices of the
  hidden columns, slice j's combine under slice j+1's GEMM (backward: slice j's gradient dispatch under
  slice j-1's input-gradient GEMM). No GEMM loses rows, so no tile goes short (a token split halves each
  expert's rows: at 128 experts per rank the micro-batches' GEMMs cost 1.5x the whole batch's), and no
  byte crosses the wire twice (an expert split sends a token once per group). The dispatch stays exposed.
  Needs ColumnCombine.
- `comm = priority`: shared SMs, the communication stream at the device's highest priority, so its
  kernels' blocks start ahead of a running GEMM's pending ones (any backend; micro-batch modes only:
  beside mode columns it hung DeepEP V1 on 2 x H200);
- `comm = partition`: the communication held to the case's `sms` by the backend (its SM control), the
  GEMMs to the rest (a CUDA green context where torch has them, else the GEMM carve-out);
- `comm = zero-sm`: the payload moved on no SM (ZeroSmComm: NCCL's zero-CTA policy);
- `comm = hook`: the receive deferred to a hook (RecvHook: DeepEP's return_recv_hook), so no dispatch
  kernel holds an SM while the GEMMs run.
"""

from __future__ import annotations

import math

import torch

from moelab.backends.capabilities import (
    ColumnCombine,
    MaskedRouting,
    RecvHook,
    ReusedReceiveBuffer,
    ZeroSmComm,
)
from moelab.core.e2e_spec import COLUMN_ALIGN, OVERLAPPED, E2ESettings


def column_unit(backend: type | object) -> int:
    """The columns a slice of mode columns is a multiple of on `backend`; 0 where it declares none."""
    unit = int(getattr(backend, "column_unit", 0) or 0) if isinstance(backend, ColumnCombine) else 0
    return math.lcm(unit, COLUMN_ALIGN) if unit > 0 else 0


def column_bounds(hidden: int, slices: int, unit: int) -> list[tuple[int, int]]:
    """`slices` contiguous, non-empty, near-equal column ranges of `hidden`, each a multiple of `unit`
    wide (fewer where there are fewer units); [] where `hidden` is not a positive multiple of `unit`."""
    if unit <= 0 or hidden <= 0 or hidden % unit:
        return []
    units = hidden // unit
    n = max(1, min(slices, units))
    edges = [unit * (units * i // n) for i in range(n + 1)]
    return [(edges[i], edges[i + 1]) for i in range(n)]


def _columns_reason(cls: type, name: str, settings: E2ESettings, hidden: int | None) -> str | None:
    unit = column_unit(cls)
    if unit == 0:
        return (
            f"e2e mode columns (hidden-column pipelining) needs a combine that takes a column slice of the "
            f"rows along the dispatch's handle (capability ColumnCombine); {name} does not declare one"
        )
    if settings.comm == "hook":
        return (
            "e2e comm = hook runs token micro-batches (tbo, chunked); mode columns dispatches the batch whole"
        )
    if settings.comm == "priority":
        return (
            "e2e comm = priority runs micro-batches (tbo, chunked, expert): beside mode columns it hung a "
            "backend's kernels in backward on 2 x H200 and gained nothing on another (results/h200x2-r14)"
        )
    if hidden is not None and hidden % unit:
        return f"e2e mode columns slices hidden in multiples of {unit} columns on {name}; hidden {hidden} is not one"
    return None


def schedule_reason(
    backend: type | object, settings: E2ESettings, comm_backend: str, hidden: int | None = None
) -> str | None:
    """Why `backend` (a backend or its class) cannot run the schedule of `settings` (at `hidden`, where
    given), or None. Kernel-free: the plan asks it for `--list-cases`, each rank again before it prepares
    the case."""
    cls = backend if isinstance(backend, type) else type(backend)
    name = getattr(cls, "name", cls.__name__)
    if settings.mode in OVERLAPPED and isinstance(cls, ReusedReceiveBuffer):
        return (
            f"e2e mode {settings.mode} keeps several micro-batches' dispatches in flight, and {name}'s dispatch "
            f"returns views of one receive buffer the next dispatch overwrites ({cls.reused_receive_buffer}); "
            "run it serial"
        )
    if settings.mode == "columns":
        reason = _columns_reason(cls, name, settings, hidden)
        if reason:
            return reason
    if settings.mode == "expert" and not isinstance(cls, MaskedRouting):
        return (
            f"e2e mode expert (expert-chunked pipelining) needs a dispatch that takes masked routing "
            f"(-1 entries in topk_idx, capability MaskedRouting); {name} does not declare one"
        )
    if settings.comm == "partition" and getattr(cls, "sm_control", None) is None:
        return f"e2e comm = partition needs the backend to hold its communication to sms; {name} has no SM control"
    if settings.comm == "zero-sm":
        if not isinstance(cls, ZeroSmComm):
            return f"e2e comm = zero-sm needs a copy-engine (zero-SM) path, capability ZeroSmComm; {name} has none"
        return cls.zero_sm_reason(comm_backend)
    if settings.comm == "hook" and not isinstance(cls, RecvHook):
        return (
            f"e2e comm = hook needs a dispatch whose receive is a hook (DeepEP low-latency return_recv_hook, "
            f"capability RecvHook); {name} has none"
        )
    if settings.comm == "hook" and settings.mode == "expert":
        return (
            "e2e comm = hook runs token micro-batches (tbo, chunked); mode expert masks the routing instead"
        )
    return None


def sms_taken_from_gemms(settings: E2ESettings, comm_sms: int | None) -> int | None:
    """The SMs the schedule takes from the expert GEMMs while communication runs beside them: the carve-out
    (or the partition's communication share), 0 for a schedule whose communication holds no SM, None where
    it is not fixed (shared SMs at the library's default: whatever its kernels occupy)."""
    if settings.mode not in ("tbo", "chunked", "expert", "columns"):
        return 0
    if settings.comm == "partition":
        return comm_sms
    if settings.comm in ("zero-sm", "hook"):
        return settings.carveout
    return settings.carveout or None  # shared: the carve-out fixes it; without one, whatever comm occupies


def expert_group_bounds(experts_per_rank: int, groups: int) -> list[tuple[int, int]]:
    """`groups` contiguous, non-empty, near-equal ranges of local expert ids."""
    n = max(1, min(groups, experts_per_rank))
    edges = [experts_per_rank * i // n for i in range(n + 1)]
    return [(edges[i], edges[i + 1]) for i in range(n)]


def expert_group_routing(
    topk_idx: torch.Tensor, topk_weights: torch.Tensor, experts_per_rank: int, groups: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per expert group, the routing masked to the group's experts on every rank: topk_idx -1 and weight 0
    elsewhere. Each (token, expert) pair lands in exactly one group, so the groups' outputs sum to the
    layer's."""
    local = topk_idx % experts_per_rank
    out = []
    for lo, hi in expert_group_bounds(experts_per_rank, groups):
        keep = (topk_idx >= 0) & (local >= lo) & (local < hi)
        out.append((torch.where(keep, topk_idx, -1), torch.where(keep, topk_weights, 0.0)))
    return out
