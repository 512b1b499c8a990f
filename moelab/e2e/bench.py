"""One end-to-end MoE-layer case on one rank: correctness against the reference, then timed ops.

A case is an e2e case when its knob `bench` is "e2e". Its other e2e knobs (E2E_KNOBS) are consumed
here and never reach the backend (backends reject knobs they do not know): build the backend's
CaseConfig with `backend_case_config`.

Knobs: `mode` "serial" (default), "tbo" (two micro-batches: one's communication under the other's
experts, moelab.e2e.overlap) or "chunked" (the same pipeline over `chunks` token chunks, default 4);
`intermediate` (expert FFN width, default hidden // 4); `backward` (default false: also time and check
forward+backward); `gemm` "auto" (default), "grouped" or "loop"; `profile` "full" (default) or "layer"
(time the layer alone: `moelab tune`'s early rounds).

Timed ops (samples [rank][iteration], µs; all but `layer*`, `compute_only_split` and `gemm_mb*` on the
whole batch):
- layer: dispatch → expert compute → combine in the case's mode (forward, no autograd);
- layer_serial (tbo, chunked): the serial layer, the baseline the overlap must beat;
- compute_only: the expert compute alone on already-dispatched rows (grouping, GEMMs, weighting);
- compute_only_split (tbo, chunked): the same, micro-batch by micro-batch as the overlapped layer does it;
- gemm: the grouped GEMMs and activation alone, on already-grouped rows;
- gemm_mb: the GEMMs of the first micro-batch alone (half the tokens), on the compute stream;
- gemm_mb_under_comm: the same GEMMs, timed on the compute stream while the whole batch's dispatch and
  combine run on the communication stream: what the SMs the communication holds cost the GEMMs;
- dispatch, combine: the backend's calls alone;
- layer_fwd_bwd (backward): forward and backward with a fixed output gradient, weight gradients included;
- layer_fwd_bwd_serial (backward; tbo, chunked): the same with the serial forward.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from moelab.accounting.bandwidth import count_rows
from moelab.backends.base import Backend, BackendContext, CaseConfig
from moelab.e2e.contention import ConcurrentGemm
from moelab.e2e.layer import (
    GEMM_IMPLS,
    MoELayer,
    default_intermediate,
    layer_tokens,
    local_expert_weights,
    output_grad,
    resolve_gemm,
    supports_backward,
    swiglu_ffn,
)
from moelab.e2e.overlap import Streams, chunk_bounds, compute_chunked, forward_pipelined
from moelab.e2e.reference import grad_tolerance, layer_tolerance, reference_layer
from moelab.errors import SpecError
from moelab.launch.rundir import JobFiles
from moelab.measure.reference import relative_error
from moelab.measure.stats import summarize
from moelab.measure.timing import Clock
from moelab.plan.routing import route_all
from moelab.plan.spec import CaseSpec, RunSpec
from moelab.plan.workload import Workload

BENCH_KNOB = "bench"
BENCH_E2E = "e2e"
E2E_KNOBS = (BENCH_KNOB, "mode", "chunks", "intermediate", "backward", "gemm", "profile")
PROFILES = ("full", "layer")
MODES = ("serial", "tbo", "chunked")
OVERLAPPED = ("tbo", "chunked")
DEFAULT_CHUNKS = 4


def is_e2e(knobs: Mapping[str, Any]) -> bool:
    return knobs.get(BENCH_KNOB) == BENCH_E2E


def backend_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs meant for the backend: all but the e2e ones."""
    return {k: v for k, v in knobs.items() if k not in E2E_KNOBS}


def backend_case_config(case: CaseSpec) -> CaseConfig:
    """The CaseConfig a backend sees for `case` (e2e knobs removed; the same for non-e2e cases)."""
    return CaseConfig(
        case_id=case.case_id, workload=case.workload, sms=case.sms, knobs=backend_knobs(case.knobs)
    )


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"e2e knob {name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class E2ESettings:
    mode: str
    chunks: int  # 1 in serial mode
    intermediate: int
    backward: bool
    gemm: str  # as asked: auto / grouped / loop
    profile: str = "full"  # "layer": time the layer alone (moelab tune's early rounds)

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any], workload: Workload) -> E2ESettings:
        mode = knobs.get("mode", "serial")
        if mode == "overlap":
            raise SpecError("e2e mode overlap was renamed: use mode = tbo (two micro-batches) or chunked")
        if mode not in MODES:
            raise SpecError(f"e2e knob mode must be one of {', '.join(MODES)}, got {mode!r}")
        default_chunks = {"chunked": DEFAULT_CHUNKS, "tbo": 2}.get(mode, 1)
        chunks = _positive_int("chunks", knobs.get("chunks", default_chunks))
        if mode != "chunked" and chunks != default_chunks:
            raise SpecError(
                f"e2e knob chunks = {chunks} needs mode = chunked (serial runs one chunk, tbo two micro-batches)"
            )
        intermediate = _positive_int(
            "intermediate", knobs.get("intermediate", default_intermediate(workload.hidden))
        )
        backward = knobs.get("backward", False)
        if not isinstance(backward, bool):
            raise SpecError(f"e2e knob backward must be true or false, got {backward!r}")
        gemm = knobs.get("gemm", "auto")
        if gemm not in GEMM_IMPLS:
            raise SpecError(f"e2e knob gemm must be one of {', '.join(GEMM_IMPLS)}, got {gemm!r}")
        profile = knobs.get("profile", "full")
        if profile not in PROFILES:
            raise SpecError(f"e2e knob profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        return cls(
            mode=mode, chunks=chunks, intermediate=intermediate, backward=backward, gemm=gemm, profile=profile
        )


def _metric(name: str, value: float | None, unit: str, definition: str) -> dict[str, Any]:
    kept = float(value) if value is not None and math.isfinite(value) else None
    return {"name": name, "value": kept, "unit": unit, "definition": definition}


def _layer_only_metrics(
    med: Mapping[str, float], settings: E2ESettings, workload: Workload, check: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """profile = layer: the layer's time and throughput only (the other ops were not timed)."""
    layer, tokens = med["layer"], workload.tokens_per_rank
    out = [
        _metric("layer_us", layer, "us", f"median forward layer time ({settings.mode}), slowest rank per iteration"),
        _metric("tokens_per_s_per_rank", tokens / (layer * 1e-6) if layer > 0 else None, "tokens/s",
                "tokens per rank / layer time"),
        _metric("layer_rel_err", check.get("layer_err"), "ratio",
                "max over ranks of ||out - ref|| / ||ref|| (float32 reference)"),
    ]  # fmt: skip
    if settings.backward:
        fb = med["layer_fwd_bwd"]
        out.append(
            _metric("tokens_per_s_per_rank_fwd_bwd", tokens / (fb * 1e-6) if fb > 0 else None, "tokens/s",
                    "tokens per rank / forward+backward layer time")
        )  # fmt: skip
    return out


def e2e_metrics(
    ops: Mapping[str, Mapping[str, Any]],
    settings: E2ESettings,
    workload: Workload,
    pairs_per_rank: list[int],
    check: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Derived figures of one case from its gathered samples (medians of the slowest rank per iteration)."""
    med = {op: summarize(data["samples_us"]).median_us for op, data in ops.items()}
    if settings.profile == "layer":
        return _layer_only_metrics(med, settings, workload, check)
    layer, compute = med["layer"], med["compute_only"]
    comm = med["dispatch"] + med["combine"]
    exposed = layer - compute
    tokens = workload.tokens_per_rank
    hidden, inter = workload.hidden, settings.intermediate
    flops_per_rank = sum(6.0 * p * hidden * inter for p in pairs_per_rank) / max(len(pairs_per_rank), 1)
    out = [
        _metric(
            "layer_us",
            layer,
            "us",
            f"median forward layer time ({settings.mode}), slowest rank per iteration",
        ),
        _metric(
            "tokens_per_s_per_rank",
            tokens / (layer * 1e-6) if layer > 0 else None,
            "tokens/s",
            "tokens per rank / layer time",
        ),
        _metric("comm_us", comm, "us", "dispatch + combine, each timed alone on the whole batch"),
        _metric(
            "exposed_comm_us",
            exposed,
            "us",
            "time the expert compute waits: layer time - compute_only time (expert compute alone, whole batch)",
        ),
        _metric(
            "exposed_comm_share",
            exposed / layer if layer > 0 else None,
            "ratio",
            "exposed_comm_us / layer_us",
        ),
        _metric(
            "overlap_efficiency",
            (comm - exposed) / comm if comm > 0 else None,
            "ratio",
            "hidden / total communication = (comm_us - exposed_comm_us) / comm_us: 1 = all hidden, "
            "0 = none (serial), < 0 = the schedule adds more than it hides",
        ),
        _metric(
            "gemm_tflops_per_rank",
            flops_per_rank / (med["gemm"] * 1e-6) / 1e12 if med["gemm"] > 0 else None,
            "TFLOP/s",
            "mean over ranks of the expert GEMM FLOPs (6 x pairs x hidden x intermediate) / gemm time",
        ),
        _metric(
            "gemm_slowdown",
            med["gemm_mb_under_comm"] / med["gemm_mb"] - 1.0 if med["gemm_mb"] > 0 else None,
            "ratio",
            "one micro-batch's GEMMs under the whole batch's dispatch+combine (concurrent, on another "
            "stream) / the same GEMMs alone - 1: what the communication's SMs cost the GEMMs",
        ),
        _metric(
            "layer_rel_err",
            check.get("layer_err"),
            "ratio",
            "max over ranks of ||out - ref|| / ||ref|| (float32 reference)",
        ),
    ]
    if settings.mode in OVERLAPPED:
        serial = med["layer_serial"]
        out += [
            _metric(
                "speedup_vs_serial",
                serial / layer if layer > 0 else None,
                "ratio",
                f"serial layer time / {settings.mode} layer time (> 1: the overlap pays off)",
            ),
            _metric(
                "split_overhead_us",
                med["compute_only_split"] - compute,
                "us",
                f"expert compute in {settings.chunks} micro-batches - in one",
            ),
        ]
    if settings.backward:
        fb = med["layer_fwd_bwd"]
        out += [
            _metric(
                "tokens_per_s_per_rank_fwd_bwd",
                tokens / (fb * 1e-6) if fb > 0 else None,
                "tokens/s",
                "tokens per rank / forward+backward layer time",
            ),
            _metric(
                "grad_x_rel_err",
                check.get("grad_x_err"),
                "ratio",
                "max over ranks of the input gradient's relative error",
            ),
            _metric(
                "grad_w_rel_err",
                check.get("grad_w_err"),
                "ratio",
                "max over ranks of the local expert weight gradients' relative error",
            ),
        ]
        if settings.mode in OVERLAPPED:
            fbs = med["layer_fwd_bwd_serial"]
            out.append(
                _metric(
                    "speedup_vs_serial_fwd_bwd",
                    fbs / fb if fb > 0 else None,
                    "ratio",
                    f"serial forward+backward time / {settings.mode} forward+backward time",
                )
            )
    return out


def _check(
    layer: MoELayer,
    forward: Callable[[torch.Tensor], torch.Tensor],
    settings: E2ESettings,
    workload: Workload,
    ctx: BackendContext,
    x: torch.Tensor,
    combine_dtype: str,
) -> dict[str, Any]:
    """This rank's errors against the reference; messages name what failed."""
    routings = route_all(workload, ctx.world)
    routing = routings[ctx.rank]
    seed, hidden, inter = workload.routing.seed, workload.hidden, settings.intermediate
    gout = (
        output_grad(seed, ctx.rank, workload.tokens_per_rank, hidden, x.device) if settings.backward else None
    )
    with torch.no_grad():
        out = forward(x)
    ref = reference_layer(
        x, routing.topk_idx, routing.topk_weights, seed=seed, intermediate=inter, grad_out=gout
    )
    result: dict[str, Any] = {"layer_err": relative_error(out, ref.out), "messages": []}
    tol = layer_tolerance(workload.dtype, combine_dtype)
    if not result["layer_err"] <= tol:
        result["messages"].append(f"rank {ctx.rank} layer output error {result['layer_err']:.3g} > {tol:g}")
    if gout is None:
        return result
    xg = x.detach().requires_grad_(True)
    layer.weights.zero_grad()
    forward(xg).backward(gout)
    # local experts' weight gradients need every rank's tokens: all are rebuilt from (seed, rank)
    all_x = torch.cat(
        [layer_tokens(seed, r, workload.tokens_per_rank, hidden, x.device) for r in range(ctx.world)]
    )
    all_g = torch.cat(
        [output_grad(seed, r, workload.tokens_per_rank, hidden, x.device) for r in range(ctx.world)]
    )
    local = range(layer.weights.first_expert, layer.weights.first_expert + layer.weights.num_experts)
    ref_w = reference_layer(
        all_x, torch.cat([r.topk_idx for r in routings]), torch.cat([r.topk_weights for r in routings]),
        seed=seed, intermediate=inter, experts=local, grad_out=all_g,
    )  # fmt: skip
    assert xg.grad is not None and ref.grad_x is not None
    w13, w2 = layer.weights.w13.grad, layer.weights.w2.grad
    assert w13 is not None and w2 is not None
    got_w = torch.cat([w13.float().flatten(), w2.float().flatten()])
    want_w = torch.cat(
        [
            torch.stack([ref_w.grad_w13[e] for e in local]).flatten(),
            torch.stack([ref_w.grad_w2[e] for e in local]).flatten(),
        ]
    )
    result["grad_x_err"] = relative_error(xg.grad, ref.grad_x)
    result["grad_w_err"] = relative_error(got_w, want_w)
    gtol = grad_tolerance(workload.dtype, combine_dtype)
    for name in ("grad_x_err", "grad_w_err"):
        if not result[name] <= gtol:
            result["messages"].append(
                f"rank {ctx.rank} {name.removesuffix('_err')} error {result[name]:.3g} > {gtol:g}"
            )
    layer.weights.zero_grad()
    return result


def _trace_layers(
    name: str,
    case: CaseSpec,
    spec: RunSpec,
    ctx: BackendContext,
    files: JobFiles,
    timed: Mapping[str, Callable[[], object]],
) -> list[dict[str, Any]]:
    """A few more iterations of the layer (and the serial layer) under torch.profiler: the trace shows
    whether the communication kernels run under the GEMMs. Every rank's trace path, gathered."""
    from moelab.tracing.torch_trace import TracedOp, capture_torch_trace, trace_path

    ops = [TracedOp(op=op, fn=timed[op]) for op in ("layer", "layer_serial") if op in timed]
    with torch.no_grad():
        cap = capture_torch_trace(
            ops, backend=name, case_id=case.case_id, iters=spec.trace.iters,
            path=trace_path(files.dir, case.case_id, ctx.rank), rank=ctx.rank, world_size=ctx.world,
            device=ctx.device, group=ctx.group,
        )  # fmt: skip
    mine = {
        "rank": ctx.rank,
        "kind": "torch",
        "path": str(cap.path.relative_to(files.run_dir)),
        "size_bytes": cap.size_bytes,
    }
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, mine, group=ctx.group)
    return gathered


def run_e2e_case(
    backend: Backend,
    case: CaseSpec,
    ctx: BackendContext,
    spec: RunSpec,
    clock: Clock,
    files: JobFiles | None = None,
) -> dict[str, Any]:
    """One e2e case on this rank; returns the record (complete on rank 0), shaped like worker.run_case's."""
    record: dict[str, Any] = {
        "case_id": case.case_id,
        "backend": case.backend,
        "case": case.to_dict(),
        "world": ctx.world,
        "gpus_per_node": ctx.gpus_per_node,
    }
    if case.skip_reason:
        return record | {"status": "skipped", "reason": case.skip_reason}
    wl = case.workload
    try:
        settings = E2ESettings.from_knobs(case.knobs, wl)
        gemm = resolve_gemm(settings.gemm, ctx.device, wl.hidden, settings.intermediate)
    except SpecError as exc:
        return record | {"status": "unsupported", "reason": str(exc)}
    cfg = backend_case_config(case)
    reason = backend.unsupported_reason(cfg)
    if reason:
        return record | {"status": "unsupported", "reason": reason}
    backend.prepare(cfg)
    reason = supports_backward(backend) if settings.backward else None
    if reason:
        return record | {"status": "unsupported", "reason": reason}
    e2e_record = {
        "mode": settings.mode,
        "chunks": settings.chunks,
        "intermediate": settings.intermediate,
        "backward": settings.backward,
        "gemm": gemm,
        "profile": settings.profile,
    }
    record["backend_record"] = backend.record(cfg) | {"e2e": e2e_record}

    seed, device = wl.routing.seed, ctx.device
    routing = route_all(wl, ctx.world)[ctx.rank].to(device)
    idx, w = routing.topk_idx, routing.topk_weights
    x = layer_tokens(seed, ctx.rank, wl.tokens_per_rank, wl.hidden, device)
    weights = local_expert_weights(
        seed,
        ctx.rank,
        wl.experts_per_rank,
        wl.hidden,
        settings.intermediate,
        device,
        requires_grad=settings.backward,
    )
    layer = MoELayer(backend, weights, wl.experts_per_rank, gemm)
    streams = Streams(device)

    def forward(xx: torch.Tensor) -> torch.Tensor:
        if settings.mode in OVERLAPPED:
            return forward_pipelined(layer, xx, idx, w, settings.chunks, streams)
        return layer.forward(xx, idx, w)

    combine_dtype = backend.combine_dtype(cfg)
    mine = _check(layer, forward, settings, wl, ctx, x, combine_dtype)
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, mine, group=ctx.group)
    check: dict[str, Any] = {"messages": [m for g in gathered for m in g["messages"]]}
    for name in ("layer_err", "grad_x_err", "grad_w_err"):
        if name in mine:
            check[name] = max(g[name] for g in gathered)
    check["tolerance"] = layer_tolerance(wl.dtype, combine_dtype)
    record["check"] = check
    if check["messages"]:
        return record | {"status": "incorrect", "reason": "; ".join(check["messages"])[:2000]}

    t = spec.timing
    gout = output_grad(seed, ctx.rank, wl.tokens_per_rank, wl.hidden, device)
    local: dict[str, list[float]] = {}
    with torch.no_grad():
        full = layer.dispatch(x, idx, w)
        expert_out = layer.experts(full)
        g = full.grouped
        split = [
            layer.dispatch(x[a:b], idx[a:b], w[a:b])
            for a, b in chunk_bounds(wl.tokens_per_rank, settings.chunks)
        ]
        ha, hb = chunk_bounds(wl.tokens_per_rank, 2)[0]  # micro-batch A of the two-batch overlap
        first = layer.dispatch(x[ha:hb], idx[ha:hb], w[ha:hb]).grouped

        def gemm_mb() -> object:
            return swiglu_ffn(first.x, first.offsets, weights, gemm)

        def comm_whole() -> object:
            return backend.combine(expert_out, backend.dispatch(x, idx, w).handle)

        under_comm = ConcurrentGemm(streams, gemm_mb, comm_whole)
        timed: dict[str, Callable[[], object]] = {
            "layer": lambda: forward(x),
            "compute_only": lambda: layer.experts(full),
            "gemm": lambda: swiglu_ffn(g.x, g.offsets, weights, gemm),
            "gemm_mb": gemm_mb,
            "dispatch": lambda: backend.dispatch(x, idx, w),
            "combine": lambda: backend.combine(expert_out, full.handle),
        }
        if settings.mode in OVERLAPPED:
            timed["layer_serial"] = lambda: layer.forward(x, idx, w)
            timed["compute_only_split"] = lambda: compute_chunked(layer, split)
        if settings.profile == "layer":
            timed = {"layer": timed["layer"]}
        for op, fn in timed.items():
            local[op] = clock.sample(fn, t.bounds[1], t.warmup)
        if settings.profile == "full":
            clock.sample(under_comm, t.bounds[1], t.warmup)
            local["gemm_mb_under_comm"] = under_comm.samples(t.bounds[1])
    if settings.backward:

        def fwd_bwd(fwd: Callable[[torch.Tensor], torch.Tensor]) -> None:
            weights.zero_grad()
            fwd(x.detach().requires_grad_(True)).backward(gout)

        local["layer_fwd_bwd"] = clock.sample(lambda: fwd_bwd(forward), t.bounds[1], t.warmup)
        if settings.mode in OVERLAPPED and settings.profile == "full":
            local["layer_fwd_bwd_serial"] = clock.sample(
                lambda: fwd_bwd(lambda xx: layer.forward(xx, idx, w)), t.bounds[1], t.warmup
            )
        weights.zero_grad()
    if spec.trace.mode == "torch" and files is not None:
        record["traces"] = _trace_layers(backend.name, case, spec, ctx, files, timed)
    all_samples: list[Any] = [None] * ctx.world
    dist.all_gather_object(all_samples, {"samples": local, "pairs": full.grouped.num_pairs}, group=ctx.group)
    bytes_per_row = {
        "dispatch": backend.bytes_per_token(cfg, "dispatch"),
        "combine": backend.bytes_per_token(cfg, "combine"),
    }
    record["ops"] = {
        op: {"samples_us": [s["samples"][op] for s in all_samples], "bytes_per_row": bytes_per_row.get(op, 0)}
        for op in local
    }
    pairs = [int(s["pairs"]) for s in all_samples]
    record["pairs_per_rank"] = pairs
    record["metrics"] = e2e_metrics(record["ops"], settings, wl, pairs, check)
    routings = route_all(wl, ctx.world)
    record["rows"] = [
        dataclasses.asdict(r) for r in count_rows(routings, wl.experts_per_rank, ctx.gpus_per_node)
    ]
    sync = "expert grouping: one device-to-host read of the pair count per dispatch"
    if gemm == "loop":
        sync += "; loop GEMMs: one read of the group sizes per expert compute"
    record["host_sync"] = f"{backend.host_sync_note()}; {sync}"
    return record | {"status": "ok", "reason": None}
