"""The dispatch/combine case kind on one rank: check, then time each op, then build the record (rank 0's is
the one written). The e2e layer is the other rank-side kind (moelab.measure.e2e.bench), built from the
same parts; moelab.measure.kinds maps each kind to its runner."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext, CaseConfig
from moelab.backends.capabilities import chains_pairs, library_figures
from moelab.core.case_record import CaseRecord, IbNode, IbPort, RankKernelTime, TraceFile
from moelab.core.ops import ops_for
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.rows import count_rows
from moelab.core.spec import CaseSpec
from moelab.measure import environment, ib_counters
from moelab.measure.case_context import CaseContext
from moelab.measure.correctness import CaseInputs, Checked, check_case, make_inputs
from moelab.measure.timing import Sampled
from moelab.tracing.nvtx_ranges import nvtx_range, range_name


def op_calls(backend: Backend, inputs: CaseInputs, checked: Checked) -> dict[str, Callable[[], object]]:
    """What each op runs; a backend without the phase split gets the ops it can time whole, one whose
    calls chain without a host sync (ChainedPairs) the pair too."""
    x, r = inputs.x, inputs.routing
    idx, w = r.topk_idx, r.topk_weights
    expert_out, handle = checked.expert_out, checked.handle
    assert expert_out is not None  # only a passed check is timed
    phases = backend.splits_phases()

    def roundtrip() -> object:
        return backend.combine(expert_out, backend.dispatch(x, idx, w).handle)

    def pair() -> object:  # along the known layout where there is one: no layout step, no host sync
        dispatched = backend.dispatch(x, idx, w, layout=handle) if phases else backend.dispatch(x, idx, w)
        return backend.combine(expert_out, dispatched.handle)

    calls: dict[str, Callable[[], object]] = {
        "layout": lambda: backend.layout(idx, w),
        "dispatch": lambda: backend.dispatch(x, idx, w, layout=handle),
        "dispatch_fresh": lambda: backend.dispatch(x, idx, w),
        "combine": lambda: backend.combine(expert_out, handle),
        "roundtrip": roundtrip,
        "pair": pair,
    }
    return {op: calls[op] for op in ops_for(phases, chains_pairs(backend))}


def time_ops(
    cc: CaseContext, case_id: str, calls: dict[str, Callable[[], object]], counts: Counter[str]
) -> dict[str, Sampled]:
    """Each op in turn, inside its own NVTX range, until its median is stable (TimingSpec); an op that
    holds a host sync from host-aligned iterations; an op with a library figure also the library's way."""
    out = {}
    syncs = cc.backend.host_sync_ops()
    for op, fn in calls.items():
        if cc.events is not None:
            cc.events.case_start(case_id, op)
        rname = range_name(cc.backend.name, op, case_id)

        def ranged(fn: Callable[[], object] = fn, rname: str = rname) -> object:
            with nvtx_range(rname, counts):
                return fn()

        chain = cc.spec.timing.chain if op == "pair" else 1  # K pairs per timed iteration: the pair period
        sampled = cc.clock.sample_until_stable(ranged, cc.spec.timing, host_aligned=op in syncs, repeat=chain)
        if op in cc.backend.library_timed_ops():
            # the library way: its bare call back to back, no NVTX range of ours around it
            sampled = replace(sampled, library_samples_us=cc.clock.sample_back_to_back(fn))
        out[op] = sampled
    return out


def measure_case(cc: CaseContext, case: CaseSpec) -> CaseRecord:
    ctx, backend = cc.ctx, cc.backend
    where = {"world": ctx.world, "gpus_per_node": ctx.gpus_per_node}
    if case.skip_reason:
        return CaseRecord.skipped(case, case.skip_reason, **where)
    cfg = CaseConfig.of(case)
    reason = backend.unsupported_reason(cfg)
    if reason:
        return CaseRecord.unsupported(case, reason, **where)
    backend.prepare(cfg)
    inputs = make_inputs(cfg, ctx)
    counts: Counter[str] = Counter()
    first_call = (
        cc.events.timed_setup("jit")
        if cc.events is not None and backend.compiles_on_first_call
        else contextlib.nullcontext()
    )
    with first_call, nvtx_range(range_name(backend.name, "check", case.case_id), counts):
        checked = check_case(backend, cfg, inputs, ctx)
    backend_record = backend.case_record(cfg)
    if not checked.ok:
        return CaseRecord(
            case=case,
            status="incorrect",
            reason="; ".join(checked.check.messages)[:2000],
            check=checked.check,
            backend_record=backend_record,
            world=ctx.world,
            gpus_per_node=ctx.gpus_per_node,
        )
    calls = op_calls(backend, inputs, checked)
    ib_before = ib_counters.sample() if ctx.local_rank == 0 else None
    sampled = time_ops(cc, case.case_id, calls, counts)
    ib_after = ib_counters.sample() if ctx.local_rank == 0 else None
    traced = trace_ops(cc, case.case_id, calls) if cc.spec.trace.mode == "torch" else {}
    extras = gather_extras(ctx, ib_counters.delta(ib_before, ib_after), traced)
    return build_record(cc, case, cfg, inputs, sampled, extras, checked, backend_record, dict(counts))


def trace_ops(cc: CaseContext, case_id: str, calls: dict[str, Callable[[], object]]) -> dict[str, Any]:
    """A few more iterations of each op under torch.profiler: a per-rank Chrome trace and kernel-only times."""
    if cc.files is None:
        return {}
    from moelab.tracing.kernel_time import op_kernel_times
    from moelab.tracing.torch_trace import TracedOp, capture_torch_trace, summarize_chrome_trace

    ctx, name = cc.ctx, cc.backend.name
    ops = [TracedOp(op=op, fn=fn) for op, fn in calls.items()]
    cap = capture_torch_trace(
        ops,
        backend=name,
        case_id=case_id,
        iters=cc.spec.trace.iters,
        path=cc.files.torch_trace(case_id, ctx.rank),
        rank=ctx.rank,
        world_size=ctx.world,
        device=ctx.device,
        group=ctx.group,
    )
    kt = op_kernel_times(summarize_chrome_trace(cap.path), name, case_id, cap.calls)
    rel = str(cap.path.relative_to(cc.files.run_dir))
    return {
        "trace": {"rank": ctx.rank, "kind": "torch", "path": rel, "size_bytes": cap.size_bytes},
        "ops": {op: k.to_record() for op, k in kt.items()},
    }


def gather_extras(ctx: BackendContext, ib: Any, traced: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's trace file, kernel times, IB counter delta and host, on every rank."""
    mine = {
        "traced": traced,
        "ib": ib.to_dict() if ib is not None else None,
        "host": environment.fingerprint_host(),
        "node": ctx.node,
    }
    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, mine, group=ctx.group)
    return out


def _kernel_time(d: dict[str, Any] | None) -> RankKernelTime | None:
    if not d:
        return None
    from moelab.core.case_record import KernelShare

    return RankKernelTime(
        kernel_us=d.get("kernel_us"),
        kernels=tuple(
            KernelShare(**{k: v for k, v in s.items() if k in KernelShare.__dataclass_fields__})
            for s in d.get("kernels", [])
        ),
    )


def _ib_nodes(extras: list[dict[str, Any]]) -> tuple[IbNode, ...] | None:
    nodes = []
    for e in extras:
        delta = e["ib"]
        if delta is None:
            continue
        ports = tuple(
            IbPort(**{k: p.get(k) for k in IbPort.__dataclass_fields__}) for p in delta.get("ports", [])
        )
        nodes.append(IbNode(node=e["node"], host=e["host"], elapsed_s=delta.get("elapsed_s"), ports=ports))
    return tuple(nodes) or None


def build_record(
    cc: CaseContext,
    case: CaseSpec,
    cfg: CaseConfig,
    inputs: CaseInputs,
    sampled: dict[str, Sampled],
    extras: list[dict[str, Any]],
    checked: Checked,
    backend_record: dict[str, Any],
    nvtx_counts: dict[str, int],
) -> CaseRecord:
    backend, ctx = cc.backend, cc.ctx
    wl = cfg.workload
    rows = count_rows(inputs.routings, wl.experts_per_rank, ctx.gpus_per_node)
    bpt_d, bpt_c = backend.bytes_per_token(cfg, "dispatch"), backend.bytes_per_token(cfg, "combine")
    per_op_bytes = {
        "layout": 0,
        "dispatch": bpt_d,
        "dispatch_fresh": bpt_d,
        "combine": bpt_c,
        "roundtrip": bpt_d + bpt_c,
        "pair": bpt_d + bpt_c,
    }
    syncs = backend.host_sync_ops()
    traced = any(e["traced"] for e in extras)
    results = []
    for op, s in sampled.items():
        m = OpMeasurement(
            op=op,
            samples_us=s.samples_us,
            bytes_per_row=per_op_bytes[op],
            noise=s.noise,
            noise_target=cc.spec.timing.noise_target if cc.spec.timing.iters is None else None,
            host_sync=syncs.get(op),
            kernel=[_kernel_time(e["traced"].get("ops", {}).get(op)) for e in extras] if traced else None,
            library_samples_us=s.library_samples_us,
        )
        # a library's figure only from the path and the timing its own test uses (Sampled.library_samples_us)
        library = {
            op: library_figures(backend, op, rows, m.bytes_per_row, s.library_samples_us)
            if s.library_samples_us
            else []
        }
        results.append(op_result(m, rows, library))
    traces = tuple(TraceFile(**e["traced"]["trace"]) for e in extras if e["traced"].get("trace"))
    return CaseRecord(
        case=case,
        status="ok",
        world=ctx.world,
        gpus_per_node=ctx.gpus_per_node,
        backend_record=backend_record,
        check=checked.check,
        ops=tuple(results),
        rows=tuple(rows),
        traces=traces,
        ib=_ib_nodes(extras),
        host_sync=backend.host_sync_note(),
        nvtx_counts=nvtx_counts,
    )
