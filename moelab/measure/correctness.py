"""Correctness of one case against the reference, before anything is timed; every rank agrees on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig
from moelab.core.case_record import CheckResult
from moelab.core.routing import Routing, route_all
from moelab.measure import checks
from moelab.measure.reference import make_tokens, reference_dispatch


@dataclass(frozen=True, slots=True)
class CaseInputs:
    """One rank's tokens and routing, and every rank's routing (the reference needs them all)."""

    routings: list[Routing]
    routing: Routing  # this rank's, on the device
    x: torch.Tensor  # [T, H] bf16


@dataclass(frozen=True, slots=True)
class Checked:
    check: CheckResult
    handle: Any  # the checked dispatch's handle: a cached layout for later dispatches of this routing
    expert_out: torch.Tensor | None  # rows for combine, one per received row

    @property
    def ok(self) -> bool:
        return not self.check.messages


def make_inputs(cfg: CaseConfig, ctx: BackendContext) -> CaseInputs:
    routings = route_all(cfg.workload, ctx.world)
    return CaseInputs(
        routings=routings,
        routing=routings[ctx.rank].to(ctx.device),
        x=make_tokens(cfg.workload, ctx.rank).to(ctx.device),
    )


def check_case(backend: Backend, cfg: CaseConfig, inputs: CaseInputs, ctx: BackendContext) -> Checked:
    """Dispatch (through the layout step when the backend splits it) and combine once, compared with the
    reference on every rank; a failing rank still runs combine so the collective sequence stays aligned."""
    wl = cfg.workload
    r = inputs.routing
    layout = backend.layout(r.topk_idx, r.topk_weights) if backend.splits_phases() else None
    d = backend.dispatch(inputs.x, r.topk_idx, r.topk_weights, layout=layout)
    expected = reference_dispatch(inputs.routings, ctx.rank, wl.experts_per_rank)
    dcheck = checks.check_dispatch(d, expected, wl, ctx.world)
    messages = [] if dcheck.ok else [f"rank {ctx.rank} dispatch: {dcheck.message}"]
    combine_err = float("nan")
    expert_out: torch.Tensor | None = None
    if dcheck.ok and dcheck.ref_rows is not None:
        expert_out = checks.expert_out_for(d, dcheck.ref_rows, ctx.rank, wl.experts_per_rank).to(ctx.device)
        out = backend.combine(expert_out, d.handle)
        cok, combine_err, cmsg = checks.check_combine(
            out, inputs.x, inputs.routings[ctx.rank], backend.combine_dtype(cfg)
        )
        if not cok:
            messages.append(f"rank {ctx.rank} combine: {cmsg}")
    else:
        zeros = torch.zeros(d.num_rows, wl.hidden, dtype=torch.bfloat16, device=ctx.device)
        backend.combine(zeros, d.handle)
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(
        gathered,
        {"dispatch_err": dcheck.error, "combine_err": combine_err, "messages": messages},
        group=ctx.group,
    )
    check = CheckResult(
        dispatch_err=_finite_max(g["dispatch_err"] for g in gathered),
        combine_err=_finite_max(g["combine_err"] for g in gathered),
        messages=tuple(m for g in gathered for m in g["messages"]),
    )
    return Checked(check=check, handle=d.handle, expert_out=expert_out)


def _finite_max(values: Any) -> float | None:
    finite = [float(v) for v in values if v is not None and v == v]
    return max(finite) if finite else None
