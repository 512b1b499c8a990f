"""The e2e MoE layer on one GPU at EP = 1, piece by piece, against its roofline (issue 27).

    python benchmarks/e2e_layer_gpu.py --json results/h100/e2e_layer.json
    python benchmarks/e2e_layer_gpu.py --tiny --json /tmp/e2e_layer.json      # CPU smoke run, tiny shapes

For the reference shape and every model preset (moelab.core.models; experts per rank = all experts at
EP = 1, nccl-a2a on a single-rank process group, so dispatch and combine are local copies), serial and
two-batch overlap (tbo), forward and forward+backward, it measures:

- this GPU's dense bf16 matmul rate and HBM copy rate, once (moelab.measure.peaks.measure_device_rates);
- the grouped GEMMs alone (fc1 + fc2; and their forward+backward) in TFLOP/s beside the dense rate;
- the non-GEMM compute (expert compute - GEMMs: grouping, permute, SwiGLU, un-permute) against its HBM
  floor (the bytes it must move / the copy rate; moelab.measure.e2e.roofline);
- the permute, un-permute and SwiGLU variants side by side: "index_add" (the old path: bf16 atomics,
  torch's SwiGLU), "torch" (gather + float32 weighted sum), "triton" (moelab.measure.e2e.triton_kernels);
- serial and tbo layers, tbo / serial, the split's own cost (expert compute in two micro-batches - in
  one) and % of roofline for the layer and for its compute alone.

Each layer is checked against the float32 reference (output and gradients) before it is timed. A
preset whose weights (and their gradients) would not fit is skipped, and its token count is capped
where its activations would not fit; both are said. Prints a table last; writes every figure to --json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends.base import BackendContext, CaseConfig
from moelab.backends.nccl_a2a import NcclA2ABackend
from moelab.core.e2e_spec import E2ESettings, E2ESpec
from moelab.core.models import MODELS, ModelShape
from moelab.core.spec import CaseSpec
from moelab.core.workload import Workload
from moelab.measure.e2e.activation import swiglu
from moelab.measure.e2e.correctness import LayerInputs, check_layer, make_layer_inputs
from moelab.measure.e2e.layer import MoELayer, group_by_expert, grouped_matmul, output_grad, resolve_gemm
from moelab.measure.e2e.overlap import chunk_bounds, compute_chunked
from moelab.measure.e2e.permute import pair_map, permute, unpermute
from moelab.measure.e2e.roofline import ACT_BYTES, DeviceRates, LayerWork, rates_from
from moelab.measure.timing import Clock

MEMORY_SHARE = 0.8  # of the GPU's memory the shape may use
ACTIVATION_BYTES_PER_PAIR_ELEM = (
    24  # live bf16 [P, H]-sized tensors at the peak of forward+backward, x 2 bytes
)


@dataclass
class ShapeResult:
    name: str
    tokens: int
    note: str = ""
    check: dict[str, Any] = field(default_factory=dict)
    us: dict[str, float] = field(default_factory=dict)  # op -> median µs
    derived: dict[str, float | None] = field(default_factory=dict)


def _share(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def single_rank_context() -> BackendContext:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    return BackendContext(
        rank=0,
        world=1,
        local_rank=0,
        device=device,
        group=dist.group.WORLD,
        gpus_per_node=1,
        comm_backend="nccl" if cuda else "gloo",
    )


def shapes(tiny: bool, names: list[str]) -> list[ModelShape]:
    """The chosen presets; --tiny shrinks each to a few experts of width 32 at hidden 64 (CPU smoke run)."""
    out = [MODELS[n] for n in names]
    if not tiny:
        return out
    return [
        ModelShape(
            name=m.name,
            hidden=64,
            intermediate=32,
            num_experts=min(m.num_experts, 8),
            topk=min(m.topk, 8, m.num_experts),
            source=m.source,
        )
        for m in out
    ]


def fitted_tokens(m: ModelShape, tokens: int, device: torch.device) -> tuple[int, str]:
    """The token count that fits this GPU (0: not even the weights and their gradients), and what was done."""
    if device.type != "cuda":
        return tokens, ""
    budget = torch.cuda.get_device_properties(device).total_memory * MEMORY_SHARE
    weights = 2 * 3 * m.num_experts * m.hidden * m.intermediate * 2  # bf16 W13 + W2, and their gradients
    per_token = m.topk * (m.hidden + 2 * m.intermediate) * ACTIVATION_BYTES_PER_PAIR_ELEM
    fit = int((budget - weights) // per_token)
    if fit <= 0:
        return 0, f"skipped: {weights / 2**30:.0f} GiB of weights and gradients do not fit"
    if fit < tokens:
        return fit, f"tokens capped at {fit} (activations of {tokens} would not fit)"
    return tokens, ""


def checkable(inputs: LayerInputs, m: ModelShape, device: torch.device) -> tuple[LayerInputs, str]:
    """The layer to check against the float32 reference: with its gradients where their float32
    reference (every expert's weight gradients, twice) fits beside the layer, else its output alone."""
    if device.type != "cuda":
        return inputs, ""
    budget = torch.cuda.get_device_properties(device).total_memory * MEMORY_SHARE
    reference = 2 * 4 * 3 * m.num_experts * m.hidden * m.intermediate
    if reference + 2 * 2 * 3 * m.num_experts * m.hidden * m.intermediate < budget:
        return inputs, ""
    forward_only = dataclasses.replace(inputs, settings=dataclasses.replace(inputs.settings, backward=False))
    return forward_only, f"gradients not checked: their float32 reference needs {reference / 2**30:.0f} GiB"


def check_what_fits(
    inputs: LayerInputs, m: ModelShape, wl: Workload, ctx: BackendContext
) -> tuple[dict[str, Any], str]:
    """check_layer with the gradients where their float32 reference fits, else (or when it ran out of
    memory all the same: the estimate is rough) the output alone; and what was not checked."""
    checked, why = checkable(inputs, m, ctx.device)
    try:
        return check_layer(checked, wl, ctx, "bf16"), why
    except torch.OutOfMemoryError:
        if checked.settings.backward is False:
            raise
    torch.cuda.empty_cache()
    forward_only = dataclasses.replace(inputs, settings=dataclasses.replace(inputs.settings, backward=False))
    return check_layer(
        forward_only, wl, ctx, "bf16"
    ), "gradients not checked: their float32 reference ran out of memory"


def median_us(clock: Clock, fn: Callable[[], object], iters: int, warmup: int) -> float:
    return float(statistics.median(clock.sample(fn, iters, warmup)))


def variants(device: torch.device) -> list[str]:
    """The permute/un-permute implementations this device runs: the old path, torch's, triton's on CUDA."""
    import importlib.util

    has_triton = device.type == "cuda" and importlib.util.find_spec("triton") is not None
    return ["index_add", "torch", *(["triton"] if has_triton else [])]


@contextlib.contextmanager
def shape_backend(
    ctx: BackendContext, wl: Workload, inter: int
) -> Iterator[tuple[NcclA2ABackend, E2ESettings]]:
    e2e = E2ESpec(mode="tbo", intermediate=inter, backward=True)
    case = CaseSpec(case_id=f"e2e-layer-{wl.label()}", backend="nccl-a2a", workload=wl, kind="e2e", e2e=e2e)
    cfg = CaseConfig.of(case)
    backend = NcclA2ABackend(ctx, [cfg])
    backend.prepare(cfg)
    try:
        yield backend, e2e.resolve(wl)
    finally:
        backend.close()


@dataclass(frozen=True)
class Timer:
    clock: Clock
    iters: int
    warmup: int

    def __call__(self, fn: Callable[[], object]) -> float:
        return median_us(self.clock, fn, self.iters, self.warmup)

    def ratio(self, a: Callable[[], object], b: Callable[[], object], rounds: int = 10) -> float:
        """The median over `rounds` of (a's median / b's median), each round timing a then b back to back:
        a ratio of two layers that drift together (clocks, power) is read within each round."""
        ratios = [self(a) / self(b) for _ in range(rounds)]
        return float(statistics.median(ratios))


def time_variant_pieces(t: Timer, inputs: LayerInputs, impl: str, us: dict[str, float]) -> None:
    """One permute/un-permute implementation's pieces and its serial layer, forward (no autograd)."""
    backend, weights, wl = inputs.layer.backend, inputs.weights, inputs.layer.experts_per_rank
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    layer = MoELayer(backend, weights, wl, inputs.gemm, impl)
    received = layer.dispatch(x, idx, w)
    g = received.grouped
    h = grouped_matmul(g.x, weights.w13, g.offsets, inputs.gemm)
    y = layer.ffn(g)
    recv_x = backend.dispatch(x, idx, w).recv_x
    if impl != "index_add":  # the old path's permute and SwiGLU are torch's
        us[f"permute:{impl}"] = t(lambda: permute(recv_x, g.map, impl))
        us[f"swiglu:{impl}"] = t(lambda: swiglu(h, impl))
    us[f"unpermute:{impl}"] = t(lambda: unpermute(y, g.map, impl))
    us[f"compute_only:{impl}"] = t(lambda: layer.experts(received))
    us[f"layer_serial:{impl}"] = t(lambda: layer.forward(x, idx, w))


def time_variant_fwd_bwd(t: Timer, inputs: LayerInputs, impl: str, us: dict[str, float]) -> None:
    """The same implementation's serial layer and expert compute, forward+backward."""
    backend, weights = inputs.layer.backend, inputs.weights
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    layer = MoELayer(backend, weights, inputs.layer.experts_per_rank, inputs.gemm, impl)
    gout = output_grad(0, 0, x.shape[0], x.shape[1], x.device)
    d = backend.dispatch(x, idx, w)
    recv_x = d.recv_x.detach().clone()
    grad_rows = output_grad(1, 0, recv_x.shape[0], recv_x.shape[1], x.device)

    def serial() -> None:
        weights.zero_grad()
        layer.forward(x.detach().requires_grad_(True), idx, w).backward(gout)

    def compute() -> None:
        weights.zero_grad()
        rx = recv_x.detach().requires_grad_(True)
        grouped = group_by_expert(rx, d.recv_topk_idx, d.recv_topk_weights, layer.experts_per_rank, impl)
        unpermute(layer.ffn(grouped), grouped.map, impl).backward(grad_rows)

    us[f"layer_serial_fwd_bwd:{impl}"] = t(serial)
    us[f"compute_fwd_bwd:{impl}"] = t(compute)


GEMM_KERNEL_WORDS = ("cutlass", "gemm", "nvjet", "xmma", "grouped_mm")


def kernel_split_us(fn: Callable[[], object], iters: int) -> tuple[float, float]:
    """(GEMM kernels, every other kernel) GPU time per call of `fn`, from torch.profiler: the non-GEMM part
    of the expert compute read off its own kernels, not as the difference of two timed totals (the GEMMs
    timed alone and inside the layer differ by more than the non-GEMM time of a GEMM-bound shape)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    gemm = other = 0.0
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if any(w in e.key.lower() for w in GEMM_KERNEL_WORDS):
            gemm += e.self_device_time_total
        else:
            other += e.self_device_time_total
    return gemm / iters, other / iters


def time_nongemm_kernels(inputs: LayerInputs, impl: str, us: dict[str, float]) -> None:
    """The chosen implementation's expert compute, forward and forward+backward, split into GEMM and
    other kernels (CUDA only)."""
    if inputs.x.device.type != "cuda":
        return
    backend, weights = inputs.layer.backend, inputs.weights
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    layer = MoELayer(backend, weights, inputs.layer.experts_per_rank, inputs.gemm, impl)
    d = backend.dispatch(x, idx, w)
    recv_x = d.recv_x.detach().clone()
    grad_rows = output_grad(1, 0, recv_x.shape[0], recv_x.shape[1], x.device)

    def forward() -> None:
        with torch.no_grad():
            grouped = group_by_expert(
                recv_x, d.recv_topk_idx, d.recv_topk_weights, layer.experts_per_rank, impl
            )
            unpermute(layer.ffn(grouped), grouped.map, impl)

    def fwd_bwd() -> None:
        weights.zero_grad()
        rx = recv_x.detach().requires_grad_(True)
        grouped = group_by_expert(rx, d.recv_topk_idx, d.recv_topk_weights, layer.experts_per_rank, impl)
        unpermute(layer.ffn(grouped), grouped.map, impl).backward(grad_rows)

    us["gemm_kernels"], us["non_gemm_kernels"] = kernel_split_us(forward, 5)
    us["gemm_kernels_fwd_bwd"], us["non_gemm_kernels_fwd_bwd"] = kernel_split_us(fwd_bwd, 5)
    weights.zero_grad()


def time_schedule(t: Timer, inputs: LayerInputs, us: dict[str, float]) -> tuple[int, int]:
    """The chosen implementation's GEMMs alone, grouping, tbo layer, split expert compute, dispatch and
    combine, forward and forward+backward; returns (pairs, received rows)."""
    layer, weights, gemm = inputs.layer, inputs.weights, inputs.gemm
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    with torch.no_grad():
        d = layer.backend.dispatch(x, idx, w)
        received = layer.dispatch(x, idx, w)
        g = received.grouped
        act = swiglu(grouped_matmul(g.x, weights.w13, g.offsets, gemm), "torch")
        out = layer.experts(received)
        split = [layer.dispatch(x[a:b], idx[a:b], w[a:b]) for a, b in chunk_bounds(x.shape[0], 2)]
        us["gemm_only"] = t(
            lambda: (
                grouped_matmul(g.x, weights.w13, g.offsets, gemm),
                grouped_matmul(act, weights.w2, g.offsets, gemm),
            )
        )
        us["pair_map"] = t(lambda: pair_map(d.recv_topk_idx, d.recv_topk_weights, layer.experts_per_rank))
        us["compute_only_split"] = t(lambda: compute_chunked(layer, split))
        us["layer_tbo"] = t(lambda: inputs.forward(x))
        us["tbo_over_serial_paired"] = t.ratio(lambda: inputs.forward(x), lambda: inputs.serial_forward(x))
        us["dispatch"] = t(lambda: layer.backend.dispatch(x, idx, w))
        us["combine"] = t(lambda: layer.backend.combine(out, d.handle))
    xg, ag = g.x.detach().requires_grad_(True), act.detach().requires_grad_(True)
    gh = torch.cat([act, act], dim=1)  # any gradient of fc1's output [P, 2I]
    gy = g.x.detach()  # and of fc2's [P, H]
    gout = output_grad(0, 0, x.shape[0], x.shape[1], x.device)

    def gemm_fwd_bwd() -> None:
        weights.zero_grad()
        grouped_matmul(xg, weights.w13, g.offsets, gemm).backward(gh)
        grouped_matmul(ag, weights.w2, g.offsets, gemm).backward(gy)

    def tbo_fwd_bwd() -> None:
        weights.zero_grad()
        inputs.forward(x.detach().requires_grad_(True)).backward(gout)

    us["gemm_fwd_bwd"] = t(gemm_fwd_bwd)

    def serial_fwd_bwd() -> None:
        weights.zero_grad()
        inputs.serial_forward(x.detach().requires_grad_(True)).backward(gout)

    us["layer_tbo_fwd_bwd"] = t(tbo_fwd_bwd)
    us["tbo_over_serial_paired_fwd_bwd"] = t.ratio(tbo_fwd_bwd, serial_fwd_bwd, rounds=5)
    return g.num_pairs, g.num_rows


def derive(
    us: dict[str, float], work: LayerWork, rates: DeviceRates | None, impls: list[str]
) -> dict[str, Any]:
    """The figures the issue asks for, from the medians; roofline figures None without measured rates."""
    chosen = impls[-1]
    comm = us["dispatch"] + us["combine"]
    out: dict[str, Any] = {
        "permute_impl": chosen,
        "gemm_tflops": work.gemm_flops(False) / us["gemm_only"] / 1e6,
        "gemm_tflops_fwd_bwd": work.gemm_flops(True) / us["gemm_fwd_bwd"] / 1e6,
        # tbo against serial, each round timing one then the other: what a drifting clock does not bend
        "tbo_over_serial": us["tbo_over_serial_paired"],
        "tbo_over_serial_fwd_bwd": us["tbo_over_serial_paired_fwd_bwd"],
        "tbo_over_serial_unpaired": _share(us["layer_tbo"], us[f"layer_serial:{chosen}"]),
        "split_cost_share": _share(
            us["compute_only_split"] - us[f"compute_only:{chosen}"], us[f"compute_only:{chosen}"]
        ),
    }
    for impl in impls:
        out[f"non_gemm_us:{impl}"] = us[f"compute_only:{impl}"] - us["gemm_only"]
        out[f"non_gemm_fwd_bwd_us:{impl}"] = us[f"compute_fwd_bwd:{impl}"] - us["gemm_fwd_bwd"]
        moved = ACT_BYTES * (work.pairs + work.rows) * work.hidden  # read the pairs, write the rows
        out[f"unpermute_gbps:{impl}"] = moved / us[f"unpermute:{impl}"] / 1e3
    if rates is None:
        return out
    out["dense_tflops"] = rates.matmul_tflops
    out["gemm_share_of_dense"] = out["gemm_tflops"] / rates.matmul_tflops
    out["gemm_share_of_dense_fwd_bwd"] = out["gemm_tflops_fwd_bwd"] / rates.matmul_tflops
    floor_fwd = work.bytes_floor_us(work.non_gemm_bytes(False), rates)
    floor_bwd = work.bytes_floor_us(work.non_gemm_bytes(True), rates)
    out["non_gemm_floor_us"], out["non_gemm_floor_fwd_bwd_us"] = floor_fwd, floor_bwd
    for impl in impls:
        out[f"non_gemm_over_floor:{impl}"] = _share(out[f"non_gemm_us:{impl}"], floor_fwd)
        out[f"non_gemm_over_floor_fwd_bwd:{impl}"] = _share(out[f"non_gemm_fwd_bwd_us:{impl}"], floor_bwd)
    if "non_gemm_kernels" in us:  # the chosen implementation's, read off its kernels: what is judged
        out["non_gemm_kernels_over_floor"] = _share(us["non_gemm_kernels"], floor_fwd)
        out["non_gemm_kernels_over_floor_fwd_bwd"] = _share(us["non_gemm_kernels_fwd_bwd"], floor_bwd)
    compute_fwd, compute_bwd = work.compute_floor_us(rates, False), work.compute_floor_us(rates, True)
    out["roofline_us"], out["roofline_fwd_bwd_us"] = compute_fwd + comm, compute_bwd + 2 * comm
    out["compute_roofline_share"] = _share(compute_fwd, us[f"compute_only:{chosen}"])
    out["compute_roofline_share_fwd_bwd"] = _share(compute_bwd, us[f"compute_fwd_bwd:{chosen}"])
    for mode, key, key_bwd in (
        ("serial", f"layer_serial:{chosen}", f"layer_serial_fwd_bwd:{chosen}"),
        ("tbo", "layer_tbo", "layer_tbo_fwd_bwd"),
    ):
        out[f"roofline_share_{mode}"] = _share(out["roofline_us"], us[key])
        out[f"roofline_share_{mode}_fwd_bwd"] = _share(out["roofline_fwd_bwd_us"], us[key_bwd])
    return out


def run_shape_fitting(
    ctx: BackendContext, m: ModelShape, a: argparse.Namespace, t: Timer, rates: DeviceRates | None
) -> ShapeResult:
    """run_shape, with half the tokens after an out-of-memory (the estimate of fitted_tokens is rough), and
    the halving said in the shape's note."""
    tokens, halved = a.tokens, []
    while True:
        try:
            res = run_shape(ctx, m, tokens, a.no_check, t, rates)
        except torch.OutOfMemoryError as exc:
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            fitted, _ = fitted_tokens(m, tokens, ctx.device)
            tokens = fitted // 2
            halved.append(str(fitted))
            print(f"{m.name}: out of memory at {fitted} tokens: {str(exc).splitlines()[0][:200]}", flush=True)
            if tokens < 64:
                return ShapeResult(
                    name=m.name, tokens=0, note=f"skipped: out of memory at {', '.join(halved)} tokens"
                )
            continue
        if halved:
            res.note = "; ".join(n for n in (res.note, f"out of memory at {', '.join(halved)} tokens") if n)
        return res


def run_shape(
    ctx: BackendContext, m: ModelShape, tokens: int, no_check: bool, t: Timer, rates: DeviceRates | None
) -> ShapeResult:
    tokens, note = fitted_tokens(m, tokens, ctx.device)
    res = ShapeResult(name=m.name, tokens=tokens, note=note)
    if tokens == 0:
        return res
    wl = Workload(hidden=m.hidden, tokens_per_rank=tokens, topk=m.topk, experts_per_rank=m.num_experts)
    gemm = resolve_gemm("auto", ctx.device, m.hidden, m.intermediate)
    impls = variants(ctx.device)
    with shape_backend(ctx, wl, m.intermediate) as (backend, settings):
        inputs = make_layer_inputs(backend, wl, settings, gemm, ctx)
        if not no_check:
            res.check, why = check_what_fits(inputs, m, wl, ctx)
            res.note = "; ".join(n for n in (res.note, why) if n)
            if res.check["messages"]:
                res.note = "; ".join(res.check["messages"])
                return res
        for impl in impls:
            with torch.no_grad():
                time_variant_pieces(t, inputs, impl, res.us)
            time_variant_fwd_bwd(t, inputs, impl, res.us)
        pairs, rows = time_schedule(t, inputs, res.us)
        time_nongemm_kernels(inputs, impls[-1], res.us)
        work = LayerWork(pairs=pairs, rows=rows, hidden=m.hidden, intermediate=m.intermediate)
        res.derived = derive(res.us, work, rates, impls) | {"gemm": gemm, "pairs": pairs, "rows": rows}
        inputs.weights.zero_grad()
    del inputs
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _f(v: Any, fmt: str = ".0f") -> str:
    return "—" if v is None else format(v, fmt)


def _pct(v: Any) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


def print_tables(results: list[ShapeResult], rates: DeviceRates | None) -> None:
    head = "dense bf16 matmul {} TFLOP/s, HBM copy {} GB/s".format(
        *((_f(rates.matmul_tflops), _f(rates.copy_gbps)) if rates else ("—", "—"))
    )
    print(f"\n{head}\nun-permute variants (forward µs; un-permute GB/s; non-GEMM compute / its HBM floor):")
    print(
        f"{'shape':<16} {'impl':<10} {'permute':>8} {'swiglu':>8} {'unperm':>8} {'GB/s':>6} {'compute':>9} "
        f"{'nonGEMM/floor':>13} {'serial':>8} {'fwd+bwd':>9}"
    )
    for r in results:
        for impl in ("index_add", "torch", "triton"):
            if f"compute_only:{impl}" not in r.us:
                continue
            u, d = r.us, r.derived
            print(
                f"{r.name:<16} {impl:<10} {_f(u.get(f'permute:{impl}')):>8} {_f(u.get(f'swiglu:{impl}')):>8} "
                f"{_f(u[f'unpermute:{impl}']):>8} {_f(d[f'unpermute_gbps:{impl}']):>6} "
                f"{_f(u[f'compute_only:{impl}']):>9} {_f(d.get(f'non_gemm_over_floor:{impl}'), '.2f'):>13} "
                f"{_f(u[f'layer_serial:{impl}']):>8} {_f(u[f'layer_serial_fwd_bwd:{impl}']):>9}"
            )
    print("\nper shape at EP = 1 (the chosen implementation; fwd | fwd+bwd):")
    print(
        f"{'shape':<16} {'tokens':>6} {'GEMM TF/s':>11} {'of dense':>9} {'nonGEMM/floor':>13} {'kernels':>11} "
        f"{'serial µs':>13} {'tbo/serial':>11} {'split':>6} {'% roofline':>11} {'compute %':>10}  note"
    )
    for r in results:
        d, u = r.derived, r.us
        if not d:
            print(f"{r.name:<16} {r.tokens:>6}  {r.note}")
            continue
        impl = d["permute_impl"]
        print(
            f"{r.name:<16} {r.tokens:>6} {_f(d['gemm_tflops'])}|{_f(d['gemm_tflops_fwd_bwd']):<5} "
            f"{_pct(d.get('gemm_share_of_dense'))}|{_pct(d.get('gemm_share_of_dense_fwd_bwd')):<4} "
            f"{_f(d.get(f'non_gemm_over_floor:{impl}'), '.2f')}|{_f(d.get(f'non_gemm_over_floor_fwd_bwd:{impl}'), '.2f'):<6} "
            f"{_f(d.get('non_gemm_kernels_over_floor'), '.2f')}|{_f(d.get('non_gemm_kernels_over_floor_fwd_bwd'), '.2f'):<6} "
            f"{_f(u[f'layer_serial:{impl}'])}|{_f(u[f'layer_serial_fwd_bwd:{impl}']):<6} "
            f"{_f(d['tbo_over_serial'], '.3f')}|{_f(d['tbo_over_serial_fwd_bwd'], '.3f'):<5} "
            f"{_pct(d['split_cost_share']):>6} {_pct(d.get('roofline_share_serial'))}|{_pct(d.get('roofline_share_serial_fwd_bwd')):<5} "
            f"{_pct(d.get('compute_roofline_share'))}|{_pct(d.get('compute_roofline_share_fwd_bwd')):<4}  {r.note}"
        )


def measure_rates(clock: Clock) -> DeviceRates | None:
    if clock.device.type != "cuda":
        return None  # no GPU: the roofline is not formed (and never invented)
    from moelab.measure.peaks import measure_device_rates

    return rates_from(measure_device_rates(clock))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, type=Path, help="where to write every figure")
    p.add_argument("--shapes", default="reference,deepseek-v3,qwen3-235b-a22b,mixtral-8x7b,gpt-oss-120b")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank (capped where they do not fit)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--tiny", action="store_true", help="tiny shapes (hidden 64, 8 experts at most): a CPU smoke run"
    )
    p.add_argument("--no-check", action="store_true", help="skip the float32 reference check of each layer")
    a = p.parse_args()
    if a.tiny:
        a.tokens = min(a.tokens, 32)
    names = a.shapes.split(",")
    if len(names) > 1:  # each shape in a process of its own: one shape's memory never crowds the next
        return run_each_shape_alone(a, names)
    ctx = single_rank_context()
    clock = Clock(ctx.device, ctx.group, ctx.device.type == "cuda")
    timer = Timer(clock, a.iters, a.warmup)
    name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, variants {', '.join(variants(ctx.device))}", flush=True)
    rates = measure_rates(clock)
    (m,) = shapes(a.tiny, names)
    print(
        f"{m.name}: hidden {m.hidden}, intermediate {m.intermediate}, {m.num_experts} experts, topk {m.topk}"
    )
    results = [run_shape_fitting(ctx, m, a, timer, rates)]
    print_tables(results, rates)
    write_json(a, name, rates, results)
    dist.destroy_process_group()


def run_each_shape_alone(a: argparse.Namespace, names: list[str]) -> None:
    """This script once per shape, each in a fresh process; their figures merged into --json."""
    import subprocess
    import sys

    parts = []
    for shape in names:
        out = a.json.with_name(f"{a.json.stem}.{shape}.json")
        flags = ["--tokens", str(a.tokens), "--iters", str(a.iters), "--warmup", str(a.warmup)]
        flags += ["--tiny"] * a.tiny + ["--no-check"] * a.no_check
        argv = [sys.executable, __file__, "--json", str(out), "--shapes", shape, *flags]
        done = subprocess.run(argv)
        if done.returncode != 0 or not out.exists():
            print(f"{shape}: the benchmark process ended with {done.returncode}", flush=True)
            continue
        parts.append(json.loads(out.read_text()))
        out.unlink()
    if not parts:
        raise SystemExit("no shape was measured")
    merged = parts[0] | {"shapes": [s for p in parts for s in p["shapes"]]}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(merged, indent=2, default=str))
    rates = None
    if merged.get("rates"):
        r = merged["rates"]
        rates = DeviceRates(matmul_tflops=r["dense_bf16_matmul_tflops"], copy_gbps=r["hbm_copy_gbps"])
    fields = ShapeResult.__dataclass_fields__
    print("\nall shapes:")
    print_tables(
        [ShapeResult(**{k: v for k, v in s.items() if k in fields}) for s in merged["shapes"]], rates
    )
    print(f"wrote {a.json}")


def write_json(
    a: argparse.Namespace, name: str, rates: DeviceRates | None, results: list[ShapeResult]
) -> None:
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(
        json.dumps(
            {
                "device": name,
                "torch": torch.__version__,
                "iters": a.iters,
                "warmup": a.warmup,
                "tiny": a.tiny,
                "rates": None
                if rates is None
                else {"dense_bf16_matmul_tflops": rates.matmul_tflops, "hbm_copy_gbps": rates.copy_gbps},
                "shapes": [r.__dict__ | {"source": MODELS[r.name].source} for r in results],
            },
            indent=2,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
