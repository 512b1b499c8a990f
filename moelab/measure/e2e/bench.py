"""One end-to-end MoE-layer case on one rank: correctness against the reference, then timed ops.

An e2e case (CaseSpec.kind "e2e", from a suite's `bench = "e2e"`) carries its layer settings apart from
the backend's knobs (moelab.core.e2e_spec: as asked, then resolved for the case); the layer's inputs and
check are in moelab.measure.e2e.correctness, the derived figures in moelab.measure.e2e.metrics.

Settings (`gemm` "auto" on a GPU picks the fastest expert-GEMM implementation on the case's rows,
moelab.measure.e2e.gemm_choice, stored with the kernels that ran): `mode` "serial" (default), "tbo" (two micro-batches: one's communication under the other's
experts, moelab.measure.e2e.overlap), "chunked" (the same pipeline over `chunks` token chunks, default 4)
or "expert" (expert-chunked: `chunks` groups of experts, moelab.measure.e2e.schedules); `comm` where the
overlapped schedules' communication runs: "shared" (default), "priority", "partition", "zero-sm" or "hook" (a schedule
the backend cannot run is unsupported, with the reason, before any kernel runs);
`intermediate` (expert FFN width, default hidden // 4); `backward` (default false: also time and check
forward+backward); `gemm` "auto" (default), "grouped", "padded" (one batched matmul over the experts
padded to the largest group) or "loop"; `profile` "full" (default) or "layer"
(time the layer alone: `moelab tune`'s early rounds).

Timed ops (samples [rank][iteration], µs; all but `layer*`, `compute_only_split` and `gemm_mb*` on the
whole batch):
- layer: dispatch → expert compute → combine in the case's mode (forward, no autograd);
- layer_serial (overlapped modes): the serial layer, the baseline the overlap must beat, its iterations
  interleaved with the layer's (one of each in turn, the order alternating), so the two see the same
  clocks and communicator state;
- compute_only: the expert compute alone on already-dispatched and grouped rows (GEMMs, un-permute and
  weighting; the grouping runs inside the layer's dispatch step);
- compute_only_split (overlapped modes): the same, micro-batch by micro-batch (expert group by group) as
  the overlapped layer does it;
- gemm: the grouped GEMMs and activation alone, on already-grouped rows;
- permute: the row movement around the GEMMs alone: the grouping of the received rows (pair map, one host
  sync, permute) and the un-permute of a fixed expert output (weighted sum per row), timed directly (their
  bytes are what `permute_over_floor` holds against the copy rate; a difference of two medians is not);
- gemm_mb: the GEMMs of the first micro-batch alone (half the tokens), on the compute stream;
- gemm_mb_under_comm: the same GEMMs, timed on the compute stream while the whole batch's dispatch and
  combine run on the communication stream: what the SMs the communication holds cost the GEMMs;
- dispatch, combine: the backend's calls alone;
- layer_fwd_bwd (backward): forward and backward with a fixed output gradient, weight gradients included;
- layer_fwd_bwd_serial (backward; overlapped modes): the same with the serial forward, interleaved with
  layer_fwd_bwd as layer_serial is with layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig
from moelab.backends.capabilities import BatchedLayout, HostExpertCounts, ZeroSmComm
from moelab.core.case_record import CaseRecord, CheckResult, Metric, TraceFile
from moelab.core.e2e_spec import OVERLAPPED, SERIAL_TIMING, E2ESettings
from moelab.core.errors import SpecError
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.rows import count_rows
from moelab.core.spec import CaseSpec, TimingSpec
from moelab.core.workload import Workload
from moelab.measure.case_context import CaseContext
from moelab.measure.e2e.auto_schedule import choose_schedule
from moelab.measure.e2e.carveout import carveout_reason
from moelab.measure.e2e.columns import column_compute
from moelab.measure.e2e.contention import ConcurrentGemm
from moelab.measure.e2e.correctness import LayerInputs, check_layer, make_layer_inputs
from moelab.measure.e2e.gemm_choice import choose_gemm, gemm_kernels
from moelab.measure.e2e.grouped_gemm import tuned_tiles
from moelab.measure.e2e.layer import Grouped, output_grad, resolve_gemm, supports_backward
from moelab.measure.e2e.metrics import e2e_metrics
from moelab.measure.e2e.overlap import chunk_bounds, compute_chunked, schedule_parts
from moelab.measure.e2e.permute import unpermute
from moelab.measure.e2e.roofline import run_rates
from moelab.measure.e2e.schedules import schedule_reason
from moelab.measure.timing import Clock


@dataclass(frozen=True, slots=True)
class E2ECalls:
    """What each e2e op runs, built from one dispatch of the whole batch (and of its micro-batches)."""

    forward: dict[str, Callable[[], object]]  # each timed alone, without autograd
    under_comm: ConcurrentGemm  # gemm_mb_under_comm: times itself inside the calls Clock.sample makes
    fwd_bwd: dict[str, Callable[[], object]]  # forward+backward, with autograd
    pairs: int  # (token, expert) pairs this rank received: the GEMM FLOPs


def run_e2e_case(cc: CaseContext, case: CaseSpec) -> CaseRecord:
    """One e2e case on this rank; returns its record (the same on every rank): check, then time each op,
    then trace, then build the record, as moelab.measure.a2a_case does for a dispatch/combine case."""
    backend, ctx, spec = cc.backend, cc.ctx, cc.spec
    where = {"world": ctx.world, "gpus_per_node": ctx.gpus_per_node}
    if case.skip_reason:
        return CaseRecord.skipped(case, case.skip_reason, **where)
    cfg = CaseConfig.of(case)
    prepared = prepare_case(backend, case, cfg, ctx)
    if isinstance(prepared, str):
        return CaseRecord.unsupported(case, prepared, **where)
    settings, gemm = prepared
    zero_sm = (
        backend.zero_sm_setting() if isinstance(backend, ZeroSmComm) and settings.comm == "zero-sm" else None
    )
    inputs = make_layer_inputs(backend, case.workload, settings, gemm, ctx, case.sms)
    inputs, gemm_record = settle_gemm(inputs, ctx)
    if settings.mode == "auto":  # the schedule, chosen on the case's rows (moelab.measure.e2e.auto_schedule)
        inputs, auto_record = choose_schedule(inputs, backend, ctx, case.workload)
        gemm_record |= auto_record
        settings = inputs.settings
    e2e_record = (
        settings.to_record(inputs.gemm)
        | gemm_record
        | {
            "permute": inputs.permute,
            "schedule_detail": inputs.schedule(),
            "gemm_sms": inputs.gemm_sms_note(),
            "sms_taken_from_gemms": inputs.sms_taken(case.sms),
        }
    )
    if zero_sm is not None:
        e2e_record["zero_sm"] = zero_sm
    if settings.compares_serial and settings.profile == "full":
        e2e_record["serial_timing"] = SERIAL_TIMING  # time_ops: PAIRED_OPS
    backend_record = backend.case_record(cfg) | {"e2e": e2e_record}
    check = check_layer(inputs, case.workload, ctx, backend.combine_dtype(cfg))
    if settings.backward and settings.compares_serial:  # how the check's backward took the weights' gradient
        how = inputs.layer.wgrad_how  # moelab.measure.e2e.wgrad
        e2e_record["wgrad"] = f"deferred, {how}" if how else "autograd, per part"
        if settings.mode == "columns" and inputs.overlaps:  # one part: moelab.measure.e2e.columns
            e2e_record["wgrad"] = "columns: W2 once over the slices side by side, W13 by autograd (whole)"
    if check["messages"]:
        reason = "; ".join(check["messages"])[:2000]
        return CaseRecord(
            case=case,
            status="incorrect",
            reason=reason,
            backend_record=backend_record,
            check=check_result(check),
            world=ctx.world,
            gpus_per_node=ctx.gpus_per_node,
        )
    calls = op_calls(backend, inputs, case.workload, ctx.rank)
    local = time_ops(cc.clock, spec.timing, calls, inputs)
    traces = trace_layers(cc, case, calls.forward) if spec.trace.mode == "torch" and cc.files else ()
    samples, pairs = gather_samples(ctx, local, calls.pairs)
    measured = Measured(samples=samples, pairs=pairs, check=check, traces=traces)
    return build_record(cc, case, cfg, settings, inputs, measured, backend_record)


def settle_gemm(inputs: LayerInputs, ctx: BackendContext) -> tuple[LayerInputs, dict[str, Any]]:
    """The expert-GEMM implementation the case runs (auto on a GPU with the grouped kernel: the fastest of
    the candidates on the rows its GEMMs see, moelab.measure.e2e.gemm_choice: the whole batch, and the
    parts of an overlapped schedule under its GEMM carve-out) and, on CUDA, the kernels it launched on
    them, for the record. Untimed dispatches of the whole batch and of the parts, on every rank."""
    if not inputs.x.is_cuda:
        return inputs, {}
    settings, layer = inputs.settings, inputs.layer
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    with torch.no_grad():
        grouped = layer.dispatch(x, idx, w).grouped
        parts: list[Grouped] = []
        if settings.mode in OVERLAPPED and settings.mode != "auto":
            split = schedule_parts(x, idx, w, settings.mode, settings.chunks, layer.experts_per_rank)
            parts = [layer.dispatch(p.x, p.topk_idx, p.topk_weights).grouped for p in split]
    record: dict[str, Any] = {}
    if settings.gemm == "auto" and inputs.gemm == "grouped":
        # the whole batch (the serial layer's GEMMs) and the parts choose apart: one choice for both would
        # hold the serial layer a case compares with to the parts' implementation, or the parts to its
        choice = choose_gemm(layer, [grouped], ctx.group, ctx.world)
        layer.gemm = choice.impl
        inputs = dataclasses.replace(inputs, gemm=choice.impl)
        record["gemm_trials_us"] = {k: round(v, 2) for k, v in choice.trials_us.items()}
        if parts:
            # the parts' GEMMs run under the overlapped layer's carve-out, so they are timed under it: held
            # to the SMs it leaves, moelab's Triton kernel runs persistent and torch's CUTLASS kernel sizes
            # its grid, at costs that differ by shape (4 x H200, DeepSeek-V3: Triton +28%, CUTLASS +0% at
            # 8 SMs held back; results/h200x4-r16)
            with inputs.carved():
                part = choose_gemm(layer, parts, ctx.group, ctx.world)
            layer.part_gemm = part.impl
            record["gemm_part"] = part.impl
            record["gemm_part_trials_us"] = {k: round(v, 2) for k, v in part.trials_us.items()}
            record["gemm_part_carveout"] = inputs.carveout
    record["gemm_kernels"] = gemm_kernels(lambda: layer.ffn(grouped))
    if parts:  # a part averages fewer rows per expert: torch may pick another tile for it
        with layer.parts(), inputs.carved():
            record["gemm_kernels_part"] = gemm_kernels(lambda: layer.ffn(parts[0]))
    if tiles := tuned_tiles(inputs.x.shape[1], settings.intermediate):  # the Triton GEMM ran: its tiles
        record["gemm_triton_tiles"] = tiles
    return inputs, record


def check_result(check: Mapping[str, Any]) -> CheckResult:
    return CheckResult(
        dispatch_err=check.get("dispatch_err"),
        combine_err=check.get("combine_err"),
        messages=tuple(check.get("messages") or ()),
    )


def prepare_case(
    backend: Backend, case: CaseSpec, cfg: CaseConfig, ctx: BackendContext
) -> tuple[E2ESettings, str] | str:
    """The case's settings and resolved GEMM implementation, the backend prepared for it; or why the
    case cannot run (bad e2e settings, the backend's own reason, no backward through this backend)."""
    assert case.e2e is not None  # an e2e case carries its settings (CaseSpec checks it)
    try:
        settings = case.e2e.resolve(case.workload, case.sms)
        gemm = resolve_gemm(settings.gemm, ctx.device, case.workload.hidden, settings.intermediate)
    except SpecError as exc:
        return str(exc)
    reason = carveout_reason(settings.carveout, ctx.device)
    if reason:
        return reason
    reason = schedule_reason(
        backend, settings, ctx.comm_backend, case.workload.hidden
    ) or backend.unsupported_reason(cfg)
    if reason:
        return reason
    backend.prepare(cfg)
    reason = supports_backward(backend) if settings.backward else None
    if reason:
        return reason
    return settings, gemm


def op_calls(backend: Backend, inputs: LayerInputs, wl: Workload, rank: int) -> E2ECalls:
    """The ops the case's settings time (see the module docstring), over dispatches made once here."""
    settings, layer = inputs.settings, inputs.layer
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    with torch.no_grad():
        full = layer.dispatch(x, idx, w)
        expert_out = layer.experts(full)
        g = full.grouped
        parts = schedule_parts(x, idx, w, settings.mode, settings.chunks, wl.experts_per_rank)
        split = [layer.dispatch(p.x, p.topk_idx, p.topk_weights) for p in parts]
        ha, hb = chunk_bounds(wl.tokens_per_rank, 2)[0]  # micro-batch A of the two-batch overlap
        first = layer.dispatch(x[ha:hb], idx[ha:hb], w[ha:hb]).grouped

    def gemm_mb() -> object:
        with layer.parts():  # micro-batch A's GEMMs, as the overlapped layer runs them
            return layer.ffn(first)

    def gemm_mb_carved() -> object:  # as the overlapped layer launches them: with its carve-out
        with inputs.carved():
            return gemm_mb()

    def comm_whole() -> object:
        return backend.combine(expert_out, backend.dispatch(x, idx, w).handle)

    with torch.no_grad():
        pair_out = layer.ffn(g)  # a fixed expert output for the permute op's un-permute

    def permute_only() -> object:
        return unpermute(pair_out, layer.regroup(full).map, layer.permute)

    forward: dict[str, Callable[[], object]] = {
        "layer": lambda: inputs.forward(x),
        "compute_only": lambda: layer.experts(full),
        "gemm": lambda: layer.ffn(g),
        "permute": permute_only,
        "gemm_mb": gemm_mb,
        "dispatch": lambda: backend.dispatch(x, idx, w),
        "combine": lambda: backend.combine(expert_out, full.handle),
    }
    if settings.compares_serial:
        forward["layer_serial"] = lambda: inputs.serial_forward(x)
        # the parts' GEMM: see compute_chunked; columns: the whole batch's rows, the tail in column slices
        forward["compute_only_split"] = (
            (lambda: column_compute(layer, full, settings.chunks))
            if settings.mode == "columns"
            else (lambda: compute_chunked(layer, split))
        )
    if settings.profile == "layer":
        forward = {"layer": forward["layer"]}
    return E2ECalls(
        forward=forward,
        under_comm=ConcurrentGemm(inputs.streams, gemm_mb_carved, comm_whole),
        fwd_bwd=fwd_bwd_calls(inputs, wl, rank),
        pairs=full.grouped.num_pairs,
    )


def fwd_bwd_calls(inputs: LayerInputs, wl: Workload, rank: int) -> dict[str, Callable[[], object]]:
    """Forward+backward with a fixed output gradient, weight gradients included (backward cases only)."""
    settings = inputs.settings
    if not settings.backward:
        return {}
    x, weights = inputs.x, inputs.weights
    gout = output_grad(wl.routing.seed, rank, wl.tokens_per_rank, wl.hidden, x.device)

    def fwd_bwd(fwd: Callable[[torch.Tensor], torch.Tensor], carved: bool) -> None:
        weights.zero_grad()
        with inputs.carved() if carved else contextlib.nullcontext():  # the backward's GEMMs too
            fwd(x.detach().requires_grad_(True)).backward(gout)

    calls: dict[str, Callable[[], object]] = {"layer_fwd_bwd": lambda: fwd_bwd(inputs.forward, True)}
    if settings.compares_serial and settings.profile == "full":
        calls["layer_fwd_bwd_serial"] = lambda: fwd_bwd(inputs.serial_forward, False)
    return calls


# each overlapped schedule's op and its serial baseline: timed interleaved (Clock.sample_interleaved), so
# speedup_vs_serial compares iterations run side by side in time, not two blocks minutes apart
PAIRED_OPS = {"layer": "layer_serial", "layer_fwd_bwd": "layer_fwd_bwd_serial"}


def time_ops(
    clock: Clock, timing: TimingSpec, calls: E2ECalls, inputs: LayerInputs
) -> dict[str, list[float]]:
    """This rank's samples of each op, a fixed `timing.bounds[1]` iterations after `timing.warmup`; an
    op and its serial baseline (PAIRED_OPS) interleaved, iteration by iteration."""
    iters, warmup = timing.bounds[1], timing.warmup
    local: dict[str, list[float]] = {}

    def sample(ops: Mapping[str, Callable[[], object]]) -> None:
        for op, fn in ops.items():
            if op in local:
                continue
            partner = PAIRED_OPS.get(op)
            if partner is not None and partner in ops:
                local[op], local[partner] = clock.sample_interleaved([fn, ops[partner]], iters, warmup)
            else:
                local[op] = clock.sample(fn, iters, warmup)

    with torch.no_grad():
        sample(calls.forward)
        if inputs.settings.profile == "full":
            clock.sample(calls.under_comm, iters, warmup)
            local["gemm_mb_under_comm"] = calls.under_comm.samples(iters)
    sample(calls.fwd_bwd)
    if calls.fwd_bwd:
        inputs.weights.zero_grad()
    return local


def trace_layers(
    cc: CaseContext, case: CaseSpec, timed: Mapping[str, Callable[[], object]]
) -> tuple[TraceFile, ...]:
    """A few more iterations of the layer (and the serial layer) under torch.profiler: the trace shows
    whether the communication kernels run under the GEMMs. Every rank's trace file, gathered."""
    from moelab.tracing.torch_trace import TracedOp, capture_torch_trace

    ctx, files = cc.ctx, cc.files
    assert files is not None
    ops = [TracedOp(op=op, fn=timed[op]) for op in ("layer", "layer_serial") if op in timed]
    with torch.no_grad():
        cap = capture_torch_trace(
            ops,
            backend=cc.backend.name,
            case_id=case.case_id,
            iters=cc.spec.trace.iters,
            path=files.torch_trace(case.case_id, ctx.rank),
            rank=ctx.rank,
            world_size=ctx.world,
            device=ctx.device,
            group=ctx.group,
        )
    mine = TraceFile(
        rank=ctx.rank, kind="torch", path=str(cap.path.relative_to(files.run_dir)), size_bytes=cap.size_bytes
    )
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, mine, group=ctx.group)
    return tuple(gathered)


def gather_samples(
    ctx: BackendContext, local: dict[str, list[float]], pairs: int
) -> tuple[dict[str, list[list[float]]], list[int]]:
    """Every rank's samples of each op ([rank][iteration]) and pair count, on every rank."""
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, {"samples": local, "pairs": pairs}, group=ctx.group)
    samples = {op: [g["samples"][op] for g in gathered] for op in local}
    return samples, [int(g["pairs"]) for g in gathered]


@dataclass(frozen=True, slots=True)
class Measured:
    """What the ranks measured of one e2e case, gathered on every rank."""

    samples: dict[str, list[list[float]]]  # op -> [rank][iteration] µs
    pairs: list[int]  # (token, expert) pairs each rank received
    check: Mapping[str, Any]  # check_layer's errors (the metrics use them)
    traces: tuple[TraceFile, ...] = ()


def build_record(
    cc: CaseContext,
    case: CaseSpec,
    cfg: CaseConfig,
    settings: E2ESettings,
    inputs: LayerInputs,
    measured: Measured,
    backend_record: dict[str, Any],
) -> CaseRecord:
    """Each op summarised with the bytes a row carries, the derived metrics (the roofline's from the run's
    measured GPU rates, or NULL and why not), the row counts, the host syncs."""
    backend, ctx, wl = cc.backend, cc.ctx, cfg.workload
    bytes_per_row = {
        "dispatch": backend.bytes_per_token(cfg, "dispatch"),
        "combine": backend.bytes_per_token(cfg, "combine"),
    }
    ops: dict[str, dict[str, Any]] = {
        op: {"samples_us": s, "bytes_per_row": bytes_per_row.get(op, 0)} for op, s in measured.samples.items()
    }
    rows = count_rows(inputs.routings, wl.experts_per_rank, ctx.gpus_per_node)
    results = tuple(
        op_result(OpMeasurement(op=op, samples_us=s, bytes_per_row=bytes_per_row.get(op, 0)), rows)
        for op, s in measured.samples.items()
    )
    rates, no_rates = run_rates(cc.files.run_dir if cc.files is not None else None)  # RUN_DIR/rates.json
    metrics = e2e_metrics(
        ops,
        settings,
        wl,
        measured.pairs,
        measured.check,
        rows_per_rank=[r.recv_rows for r in rows],
        rates=rates,
        no_rates_reason=no_rates,
        sms_taken=inputs.sms_taken(case.sms),
    )
    return CaseRecord(
        case=case,
        status="ok",
        world=ctx.world,
        gpus_per_node=ctx.gpus_per_node,
        backend_record=backend_record,
        check=check_result(measured.check),
        ops=results,
        rows=tuple(rows),
        traces=measured.traces,
        metrics=tuple(
            Metric(name=m["name"], value=m.get("value"), unit=m.get("unit"), definition=m.get("definition"))
            for m in metrics
        ),
        host_sync=f"{backend.host_sync_note()}; {layer_host_sync(inputs.gemm, backend)}",
    )


def layer_host_sync(gemm: str, backend: Backend | None = None) -> str:
    """The host syncs the layer itself adds to the backend's (moelab.measure.e2e.layer.MoELayer.part_layouts)."""
    if isinstance(backend, BatchedLayout) and backend.splits_phases():
        return (
            "layer: every part's layout and pair counts in one count exchange and one device-to-host read "
            "(serial: one part), no read in the grouping or the GEMMs (the all-gather exchange: as below)"
            f"; otherwise {layer_host_sync(gemm)}"
        )
    if isinstance(backend, HostExpertCounts) and backend.expert_counts_on_host():
        return "expert grouping: none (the library's fresh dispatch reads the pair counts in its own sync)"
    sync = (
        "expert grouping: one device-to-host read of the pair count per dispatch (serial); the overlapped "
        "schedules read every part's once, up front"
    )
    if gemm == "loop":
        sync += "; loop GEMMs of the serial layer: one read of the group sizes per expert compute"
    return sync
