"""One rank's e2e layer and its inputs, and the layer's correctness against the float32 reference,
before anything is timed; every rank agrees on the outcome (moelab.measure.correctness's e2e twin)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext
from moelab.core.e2e_spec import OVERLAPPED, E2ESettings
from moelab.core.routing import Routing, route_all
from moelab.core.workload import Workload
from moelab.measure.e2e.carveout import gemm_carveout
from moelab.measure.e2e.columns import forward_column_pipelined
from moelab.measure.e2e.layer import ExpertWeights, MoELayer, layer_tokens, local_expert_weights, output_grad
from moelab.measure.e2e.overlap import Streams, forward_expert_pipelined, forward_hooked, forward_pipelined
from moelab.measure.e2e.permute import resolve_permute
from moelab.measure.e2e.reference import ReferenceResult, grad_tolerance, layer_tolerance, reference_layer
from moelab.measure.e2e.schedules import sms_taken_from_gemms
from moelab.measure.reference import relative_error

ERRORS = ("layer_err", "grad_x_err", "grad_w_err")


@dataclass(frozen=True, slots=True)
class LayerInputs:
    """One rank's tokens, routing and experts, and the layer over the backend in the case's mode."""

    routings: list[Routing]  # every rank's, on the host: the reference and the row counts need them all
    topk_idx: torch.Tensor  # this rank's, on the device
    topk_weights: torch.Tensor
    x: torch.Tensor  # [T, H] bf16
    weights: ExpertWeights
    layer: MoELayer
    streams: Streams
    settings: E2ESettings
    gemm: str  # the GEMM implementation `auto` resolved to
    permute: str  # the permute/un-permute (and SwiGLU) implementation: triton on CUDA with triton, else torch
    overlaps: bool = True  # False at EP = 1: no row leaves the rank, so an overlapped mode runs unsplit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer in the case's mode, on the whole batch's routing. An overlapped mode with nothing to
        hide (one rank: dispatch and combine are local copies) runs the batch whole, as a production layer
        would: splitting it would only cost smaller GEMMs and twice the launches (the record's
        split_overhead_share says how much)."""
        s = self.settings
        if s.mode not in OVERLAPPED or not self.overlaps:
            return self.serial_forward(x)
        forward: Callable[..., torch.Tensor] = forward_pipelined
        if s.mode == "expert":
            forward = forward_expert_pipelined
        elif s.mode == "columns":
            forward = forward_column_pipelined
        elif s.comm == "hook":
            forward = forward_hooked
        with self.carved(), self.layer.parts():
            return forward(self.layer, x, self.topk_idx, self.topk_weights, s.chunks, self.streams)

    @property
    def carveout(self) -> int:
        """The SMs `carved` holds back from the GEMMs: the case's carve-out, but none where the streams'
        green contexts already partition the SMs, and none off CUDA (no GEMM there leaves an SM free)."""
        if self.streams.partitioned or self.x.device.type != "cuda":
            return 0
        return self.settings.carveout

    def carved(self) -> contextlib.AbstractContextManager[None]:
        """GEMMs launched inside leave the case's carve-out of SMs to the communication."""
        return gemm_carveout(self.carveout, self.x.device)

    def sms_taken(self, comm_sms: int | None) -> int | None:
        """The SMs the schedule takes from the GEMMs as it ran: 0 where the serial layer ran (serial mode,
        or one rank); the green partition's as made; else as the settings fix them
        (moelab.measure.e2e.schedules.sms_taken_from_gemms) with the carve-out `carved` applied: off CUDA
        a case's carve-out takes nothing."""
        if self.settings.mode not in OVERLAPPED or not self.overlaps:
            return 0
        if self.streams.partitioned and self.streams.gemm_sms is not None:
            total = torch.cuda.get_device_properties(self.x.device).multi_processor_count
            return total - self.streams.gemm_sms
        return sms_taken_from_gemms(replace(self.settings, carveout=self.carveout), comm_sms)

    def gemm_sms_note(self) -> str:
        """How the GEMMs' SMs are bounded while communication runs beside them (for the record)."""
        s = self.settings
        if s.mode not in OVERLAPPED or not self.overlaps:
            return "all (serial)"
        if self.streams.partitioned:
            return f"{self.streams.gemm_sms} (CUDA green context; the communication's holds the rest)"
        if s.carveout and not self.carveout:
            return f"all (carve-out {s.carveout} not applied: no GPU SMs off CUDA)"
        if self.carveout:
            why = f"; {self.streams.partition_note}" if self.streams.partition_note else ""
            held = "GEMM SM carve-out: torch's GEMMs and moelab's Triton GEMM (persistent) run on the rest"
            return f"all but {s.carveout} ({held}{why})"
        if s.comm in ("zero-sm", "hook"):
            return "all (the communication holds no SM while they run)"
        shared = "all, shared with whatever the communication kernels occupy"
        if s.comm == "priority":
            off_cuda = "" if self.streams.cuda else "; no streams off CUDA"
            return f"{shared}, theirs first as SMs free up (communication stream priority {self.streams.comm_priority}{off_cuda})"
        return shared

    def serial_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.forward(x, self.topk_idx, self.topk_weights)

    def schedule(self) -> str:
        """What the layer's forward runs, for the record."""
        if self.settings.mode not in OVERLAPPED:
            return "serial"
        if not self.overlaps:
            return "unsplit: nothing to overlap on one rank (dispatch and combine are local copies)"
        s = self.settings
        if s.mode == "expert":
            return f"{s.chunks} expert groups, each group's communication beside another's GEMMs ({s.comm})"
        if s.mode == "columns":
            return (
                f"the batch dispatched whole; the second GEMM, un-permute and combine in {s.chunks} hidden-column "
                f"slices, each slice's combine beside the next slice's GEMM ({s.comm})"
            )
        if s.comm == "hook":
            return f"{s.chunks} micro-batches on one stream, each receive a hook called after the GEMMs before it"
        return f"{s.chunks} micro-batches, communication beside compute ({s.comm})"


def make_layer_inputs(
    backend: Backend,
    wl: Workload,
    settings: E2ESettings,
    gemm: str,
    ctx: BackendContext,
    comm_sms: int | None = None,
) -> LayerInputs:
    """The layer's inputs on this rank; `comm_sms`: the case's communication SMs (the partition's)."""
    seed, device = wl.routing.seed, ctx.device
    permute = resolve_permute("auto", device)
    routings = route_all(wl, ctx.world)
    routing = routings[ctx.rank].to(device)
    weights = local_expert_weights(
        seed,
        ctx.rank,
        wl.experts_per_rank,
        wl.hidden,
        settings.intermediate,
        device,
        requires_grad=settings.backward,
    )
    return LayerInputs(
        routings=routings,
        topk_idx=routing.topk_idx,
        topk_weights=routing.topk_weights,
        x=layer_tokens(seed, ctx.rank, wl.tokens_per_rank, wl.hidden, device),
        weights=weights,
        layer=MoELayer(backend, weights, wl.experts_per_rank, gemm, permute),
        streams=Streams(
            device,
            comm_sms if settings.comm == "partition" and ctx.world > 1 else None,
            priority=settings.comm == "priority",
        ),
        settings=settings,
        gemm=gemm,
        permute=permute,
        overlaps=ctx.world > 1,
    )


def check_layer(inputs: LayerInputs, wl: Workload, ctx: BackendContext, combine_dtype: str) -> dict[str, Any]:
    """Every rank's messages, the largest error over ranks of each kind checked, and the output tolerance."""
    mine = rank_errors(inputs, wl, ctx, combine_dtype)
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, mine, group=ctx.group)
    check: dict[str, Any] = {"messages": [m for g in gathered for m in g["messages"]]}
    for name in ERRORS:
        if name in mine:
            check[name] = max(g[name] for g in gathered)
    check["tolerance"] = layer_tolerance(wl.dtype, combine_dtype)
    return check


def rank_errors(inputs: LayerInputs, wl: Workload, ctx: BackendContext, combine_dtype: str) -> dict[str, Any]:
    """This rank's errors against the reference; messages name what failed."""
    x, seed = inputs.x, wl.routing.seed
    routing = inputs.routings[ctx.rank]
    gout = (
        output_grad(seed, ctx.rank, wl.tokens_per_rank, wl.hidden, x.device)
        if inputs.settings.backward
        else None
    )
    with torch.no_grad():
        out = inputs.forward(x)
    ref = reference_layer(
        x,
        routing.topk_idx,
        routing.topk_weights,
        seed=seed,
        intermediate=inputs.settings.intermediate,
        grad_out=gout,
        on_weight_grads=lambda e, g13, g2: (
            None
        ),  # only grad_x is wanted here: the weights' are checked per expert
    )
    result: dict[str, Any] = {"layer_err": relative_error(out, ref.out), "messages": []}
    tol = layer_tolerance(wl.dtype, combine_dtype)
    if not result["layer_err"] <= tol:
        result["messages"].append(f"rank {ctx.rank} layer output error {result['layer_err']:.3g} > {tol:g}")
    if gout is None:
        return result
    result["grad_x_err"], result["grad_w_err"] = grad_errors(inputs, ref, gout, wl, ctx)
    gtol = grad_tolerance(wl.dtype, combine_dtype)
    for name in ("grad_x_err", "grad_w_err"):
        if not result[name] <= gtol:
            result["messages"].append(
                f"rank {ctx.rank} {name.removesuffix('_err')} error {result[name]:.3g} > {gtol:g}"
            )
    return result


def grad_errors(
    inputs: LayerInputs, ref: ReferenceResult, gout: torch.Tensor, wl: Workload, ctx: BackendContext
) -> tuple[float, float]:
    """The input gradient's and the local expert weight gradients' relative errors after one backward."""
    weights = inputs.weights
    xg = inputs.x.detach().requires_grad_(True)
    weights.zero_grad()
    inputs.forward(xg).backward(gout)
    assert xg.grad is not None and ref.grad_x is not None
    errors = relative_error(xg.grad, ref.grad_x), local_weight_grads_error(inputs, wl, ctx)
    weights.zero_grad()
    return errors


@dataclass
class StreamedError:
    """||got - want|| / ||want|| over tensors compared one pair at a time, so that no more than one pair
    is ever held (what moelab.measure.reference.relative_error gives on their concatenation)."""

    diff_sq: float = 0.0
    ref_sq: float = 0.0
    finite: bool = True

    def add(self, got: torch.Tensor, want: torch.Tensor) -> None:
        got64, want64 = got.double(), want.to(got.device).double()
        self.finite = self.finite and bool(torch.isfinite(got64).all())
        self.diff_sq += float((got64 - want64).square().sum())
        self.ref_sq += float(want64.square().sum())

    def value(self) -> float:
        if not self.finite:
            return float("inf")
        num = self.diff_sq**0.5
        return num / self.ref_sq**0.5 if self.ref_sq > 0 else num


def local_weight_grads_error(inputs: LayerInputs, wl: Workload, ctx: BackendContext) -> float:
    """This rank's experts' weight gradients against the reference, one expert at a time: they need every
    rank's tokens, so all are rebuilt from (seed, rank)."""
    seed, hidden, tokens, device = wl.routing.seed, wl.hidden, wl.tokens_per_rank, inputs.x.device
    all_x = torch.cat([layer_tokens(seed, r, tokens, hidden, device) for r in range(ctx.world)])
    all_g = torch.cat([output_grad(seed, r, tokens, hidden, device) for r in range(ctx.world)])
    first = inputs.weights.first_expert
    w13, w2 = inputs.weights.w13.grad, inputs.weights.w2.grad
    assert w13 is not None and w2 is not None
    err13, err2 = StreamedError(), StreamedError()

    def compare(e: int, g13: torch.Tensor, g2: torch.Tensor) -> None:
        err13.add(w13[e - first], g13)
        err2.add(w2[e - first], g2)

    reference_layer(
        all_x,
        torch.cat([r.topk_idx for r in inputs.routings]),
        torch.cat([r.topk_weights for r in inputs.routings]),
        seed=seed,
        intermediate=inputs.settings.intermediate,
        experts=range(first, first + inputs.weights.num_experts),
        grad_out=all_g,
        on_weight_grads=compare,
    )
    both = StreamedError(
        err13.diff_sq + err2.diff_sq, err13.ref_sq + err2.ref_sq, err13.finite and err2.finite
    )
    return both.value()
