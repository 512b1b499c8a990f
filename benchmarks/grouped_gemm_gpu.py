"""The expert GEMMs of the e2e layer beside the dense matmul rate, on one GPU (issue 37).

    python benchmarks/grouped_gemm_gpu.py                 # one GPU, about a minute
    python benchmarks/grouped_gemm_gpu.py --json out.json
    python benchmarks/grouped_gemm_gpu.py --tiny          # CPU smoke run, tiny shapes
    python benchmarks/grouped_gemm_gpu.py --backward      # also forward+backward (3x the FLOPs)
    python benchmarks/grouped_gemm_gpu.py --carveout 8,16  # also grouped and triton with N SMs held back

For the DeepSeek-V3, Qwen3-235B-A22B and reference shapes at EP = 2 and 4 (rank 0's local experts and the
(token, expert) pairs moelab's uniform routing gives them, 4096 tokens per rank, topk 8), it times the
SwiGLU expert FFN (fc1 [H, 2I], SwiGLU, fc2 [I, H]: 6 x pairs x H x I FLOPs; the activation is moelab's
Triton kernel on CUDA, as in the layer, and fused into the first GEMM by `triton`) with each implementation:

- grouped: torch._grouped_mm, bf16 (the CUTLASS grouped kernel on SM90), moelab's `gemm = grouped`;
- triton: moelab's Triton grouped GEMM (moelab.measure.e2e.grouped_gemm), the activation in the first
  GEMM's epilogue, `gemm = triton`;
- padded: one torch.bmm per projection over the experts padded to the largest group, `gemm = padded`
  (FLOPs counted are the useful ones: padding rows are overhead);
- loop: one matmul per expert, `gemm = loop`;
- fp8-grouped: torch._scaled_grouped_mm with row-wise fp8 scales, the GEMMs alone on pre-quantised
  operands (what a backend that dispatches FP8 could feed it); its % is of the bf16 dense rate;

With --carveout N, `grouped@N` and `triton@N` are the same FFNs launched under a GEMM SM carve-out of N
(moelab.measure.e2e.carveout, what an overlapped layer at sms = N sets): torch's kernel sized to the SMs
left, moelab's Triton kernel persistent on them. Alone, with nothing beside them, the difference to the
whole-GPU launch is the price of leaving N SMs to the communication.

And the dense bf16 matmul rate the way `moelab run` measures it (an 8192^3 matmul of random data, median
of 20). Each variant's output is checked against the loop's first. Prints one table and the acceptance
lines (best bf16 variant >= 65% of dense at DeepSeek-V3, >= 80% at the reference), with the kernels that
ran (torch.profiler, one call each).

Two timings of each variant and of the dense matmul: `us` syncs after every call, so it holds the host's
work before the first kernel (rounds before 18 report this one); `gpu us` queues the calls back to back
(`queued_us`), so the host's work hides behind the GPU's, as in a layer that runs ahead. A third,
`paired %`, times each bf16 FFN alternately with a dense matmul of the same FLOPs, in one queue
(`paired_pct_dense`): under sustained GEMMs an H200 sits at its 700 W cap and its SM clock falls from 1980
to 1000-1450 MHz within a few hundred milliseconds (results/h200x1-r19), so a short dense burst timed
apart reads a higher rate than the FFN's longer run can: the paired reading puts both under the same
power and clock. The dense rate is also timed `sustained` (run back to back for a second, the median of
the second half: the rate under that power limit); the acceptance lines give the synced, queued and paired
readings and the queued one over the sustained dense rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from moelab.core.models import MODELS
from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure.e2e.carveout import gemm_carveout
from moelab.measure.e2e.gemm_choice import gemm_kernels
from moelab.measure.e2e.grouped_gemm import unavailable_reason
from moelab.measure.e2e.layer import ExpertWeights, swiglu_ffn
from moelab.measure.e2e.permute import pair_map

TOKENS, TOPK, ITERS, WARMUP = 4096, 8, 20, 3  # --tiny: 64 tokens
DENSE_N = 8192
REFERENCE = ("reference", 8192, 2048, 8)  # hidden, intermediate, experts per rank (any EP)


@dataclass
class Row:
    shape: str
    ep: int
    experts_per_rank: int
    pairs: int
    rows_per_expert: float
    max_group: int
    variant: str
    us: float | None
    tflops: float | None
    pct_dense: float | None
    kernels: str
    note: str = ""
    gpu_us: float | None = None  # queued_us: launches back to back, the host's work hidden
    gpu_pct_dense: float | None = None  # of the dense rate timed the same way
    paired_pct_dense: float | None = None  # of a dense matmul of equal FLOPs timed alternately with it


def median_us(fn: Callable[[], object], device: torch.device) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(ITERS):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    else:
        for _ in range(ITERS):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def queued_us(fn: Callable[[], object], device: torch.device) -> float:
    """The median GPU time of `fn`, its launches queued back to back with an event pair around each and
    one sync at the end: the host's launch work (descriptors, the autotuner's lookup, torch's dispatch)
    runs while the GPU is busy with the call before, as in a layer that runs ahead of its GPU. It is the
    timing moelab's Triton GEMM autotunes with (grouped_gemm_jit.queued_bench: 3 warm-up calls, 20 timed,
    as WARMUP and ITERS here). `median_us` syncs after every call, so the host's work before the first
    kernel is timed too."""
    if device.type != "cuda":
        return median_us(fn, device)
    from moelab.measure.e2e.grouped_gemm_jit import queued_bench  # imports triton: CUDA runs have it

    return queued_bench(fn, (0.5,))[0] * 1e3


def dense_matmul(n: int, seed: int, device: torch.device) -> Callable[[], object]:
    """An n^3 bf16 matmul of random data (seeded) into a buffer of its own: the dense rate's work."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, generator=g, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, generator=g, device=device).to(torch.bfloat16)
    c = torch.empty_like(a)
    return lambda: torch.matmul(a, b, out=c)


def dense_tflops(device: torch.device, n: int, timing: Callable[..., float] = median_us) -> float:
    t = timing(dense_matmul(n, 1, device), device)
    return 2.0 * n**3 / (t * 1e-6) / 1e12


PAIRED_WARMUP, PAIRED_ITERS = 10, 30
SUSTAINED_S = 1.0


def sustained_dense_tflops(device: torch.device, n: int, seconds: float = SUSTAINED_S) -> float:
    """The n^3 bf16 matmul run back to back for `seconds`, an event pair around each: the median rate of
    the second half, once the GPU's power limit has set its clock (`dense_tflops` times a burst of 23
    calls, most of it before the clock falls). On the CPU, wall time."""
    matmul = dense_matmul(n, 3, device)
    times: list[float] = []  # seconds
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if device.type == "cuda":
            pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            pair[0].record()
            matmul()
            pair[1].record()
            marks.append(pair)
            if len(marks) % 32 == 0:  # the host within 32 calls of the GPU: the loop's time is the GPU's
                pair[1].synchronize()
        else:
            t = time.perf_counter()
            matmul()
            times.append(time.perf_counter() - t)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) * 1e-3 for s, e in marks]
    return 2.0 * n**3 / statistics.median(times[len(times) // 2 :]) / 1e12


def step_times(
    steps: Sequence[Callable[[], object]], reps: int, warmup: int, device: torch.device, idle_s: float = 0.0
) -> list[list[float]]:
    """Each rep runs `steps` in order, queued, an event before, between and after them (one sync at the
    end, or after each rep with `idle_s` of idle GPU after it): per step, its time in each rep (us). On
    the CPU, wall time."""
    for _ in range(warmup):
        for step in steps:
            step()
    times: list[list[float]] = [[] for _ in steps]
    if device.type != "cuda":
        for _ in range(reps):
            for step, out in zip(steps, times, strict=True):
                t0 = time.perf_counter()
                step()
                out.append((time.perf_counter() - t0) * 1e6)
        return times
    marks = [[torch.cuda.Event(enable_timing=True) for _ in range(len(steps) + 1)] for _ in range(reps)]
    torch.cuda.synchronize(device)
    for m in marks:
        m[0].record()
        for step, after in zip(steps, m[1:], strict=True):
            step()
            after.record()
        if idle_s:
            torch.cuda.synchronize(device)
            time.sleep(idle_s)
    torch.cuda.synchronize(device)
    for m in marks:
        for i, out in enumerate(times):
            out.append(m[i].elapsed_time(m[i + 1]) * 1e3)
    return times


def paired_pct_dense(fn: Callable[[], object], flops: float, device: torch.device) -> float:
    """`fn`'s FLOP rate over a dense bf16 matmul's, the two run alternately in one queue (`step_times`):
    the matmul is square and as large as `fn`'s FLOPs make it (to a multiple of 256, at least 256), so
    both run as long and under the same power and clock. Medians of PAIRED_ITERS each after PAIRED_WARMUP
    pairs; on the CPU, wall time."""
    n = max(256, round((flops / 2) ** (1 / 3) / 256) * 256)
    fn_t, dense_t = (
        statistics.median(t)
        for t in step_times([fn, dense_matmul(n, 2, device)], PAIRED_ITERS, PAIRED_WARMUP, device)
    )
    return (flops / fn_t) / (2.0 * n**3 / dense_t)


def shapes(tiny: bool) -> list[tuple[str, int, int, int, int]]:
    """(name, hidden, intermediate, experts per rank, EP)."""
    if tiny:
        return [("tiny-many", 64, 32, 16, 2), ("tiny-few", 64, 32, 4, 2)]
    out = []
    for name in ("deepseek-v3", "qwen3-235b-a22b"):
        m = MODELS[name]
        out += [(name, m.hidden, m.intermediate, m.num_experts // ep, ep) for ep in (2, 4)]
    name, hidden, inter, epr = REFERENCE
    return out + [(name, hidden, inter, epr, ep) for ep in (2, 4)]


def fp8_variant(
    x: torch.Tensor, weights: ExpertWeights, offsets: torch.Tensor
) -> tuple[Callable[[], object] | None, str]:
    """The two GEMMs on fp8 operands with row-wise scales (torch._scaled_grouped_mm), or why not."""
    if x.device.type != "cuda" or not hasattr(torch, "_scaled_grouped_mm"):
        return None, "no torch._scaled_grouped_mm on this device"
    f8 = torch.float8_e4m3fn
    fmax = torch.finfo(f8).max

    def rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [.., M, K] -> fp8, [.., M] scales
        scale = t.abs().amax(dim=-1).float().clamp(min=1e-12) / fmax
        q = torch.empty(t.shape, dtype=f8, device=t.device)
        for a in range(0, t.shape[0], 16):  # in slices: a float32 copy of every expert would not fit
            q[a : a + 16] = (t[a : a + 16].float() / scale[a : a + 16].unsqueeze(-1)).to(f8)
        return q, scale

    xq, xs = rowwise(x)
    # mat_b column-major [E, K, N]: quantise the transposed weights row-wise per output column
    w13q, w13s = rowwise(weights.w13.transpose(1, 2).contiguous())
    w2q, w2s = rowwise(weights.w2.transpose(1, 2).contiguous())
    inter = weights.intermediate
    h_probe = torch.empty(x.shape[0], inter, dtype=torch.bfloat16, device=x.device)
    hq, hs = rowwise(h_probe.normal_())

    def run() -> object:
        torch._scaled_grouped_mm(
            xq, w13q.transpose(1, 2), xs, w13s, offs=offsets, out_dtype=torch.bfloat16, use_fast_accum=True
        )
        return torch._scaled_grouped_mm(
            hq, w2q.transpose(1, 2), hs, w2s, offs=offsets, out_dtype=torch.bfloat16, use_fast_accum=True
        )

    try:
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # an unsupported layout or build: say so, keep the other variants
        return None, f"torch._scaled_grouped_mm: {str(exc).splitlines()[0][:160]}"
    return (
        run,
        "GEMMs only, operands pre-quantised (quantisation not timed); % of the bf16 dense rate (fp8's peak is twice bf16's)",
    )


def train_step(
    x: torch.Tensor, weights: ExpertWeights, offsets: torch.Tensor, impl: str, act: str, max_group: int
) -> Callable[[], object]:
    """One forward+backward of the FFN with the weights and input taking gradients."""
    w = ExpertWeights(
        w13=weights.w13.detach().requires_grad_(True),
        w2=weights.w2.detach().requires_grad_(True),
        first_expert=0,
    )
    xg = x.detach().requires_grad_(True)
    grad = torch.ones_like(x)

    def step() -> object:
        xg.grad = None
        w.zero_grad()
        y = swiglu_ffn(xg, offsets, w, impl, act, max_group=max_group)
        y.backward(grad)
        return y

    return step


def _carved(fn: Callable[[], object], held: int, device: torch.device) -> Callable[[], object]:
    def run() -> object:
        with gemm_carveout(held, device):
            return fn()

    return run


@dataclass
class FfnInputs:
    """Rank 0's expert FFN at one shape: its received rows sorted by expert, the weights, the row ends."""

    x: torch.Tensor  # [pairs, H] bf16
    weights: ExpertWeights
    offsets: torch.Tensor  # [E] int32 cumulative row ends
    max_group: int
    pairs: int
    flops: float  # 6 x pairs x H x I: fc1 (2I columns) and fc2


def ffn_inputs(
    hidden: int, inter: int, epr: int, ep: int, device: torch.device, tokens: int = TOKENS
) -> FfnInputs:
    """The (token, expert) pairs moelab's uniform routing gives rank 0's experts at EP = ep, random rows and
    weights scaled to unit-variance outputs."""
    wl = Workload(
        hidden=hidden, tokens_per_rank=tokens, topk=TOPK, experts_per_rank=epr, routing=RoutingSpec(seed=0)
    )
    idx = torch.cat([r.topk_idx for r in route_all(wl, ep)])  # every rank's tokens: what rank 0 receives
    local = torch.where(idx < epr, idx, -1)
    m, offsets = pair_map(local.to(device), torch.ones_like(local, dtype=torch.float32).to(device), epr)
    pairs = m.num_pairs
    g = torch.Generator(device=device).manual_seed(0)
    bf16 = torch.bfloat16
    x = torch.randn(pairs, hidden, generator=g, device=device, dtype=bf16)
    w13 = torch.randn(epr, hidden, 2 * inter, generator=g, device=device, dtype=bf16).mul_(hidden**-0.5)
    w2 = torch.randn(epr, inter, hidden, generator=g, device=device, dtype=bf16).mul_(inter**-0.5)
    weights = ExpertWeights(w13=w13, w2=w2, first_expert=0)
    return FfnInputs(x, weights, offsets, m.max_group, pairs, 6.0 * pairs * hidden * inter)


def bench_shape(
    name: str,
    hidden: int,
    inter: int,
    epr: int,
    ep: int,
    device: torch.device,
    dense: float,
    tokens: int = TOKENS,
    backward: bool = False,
    carveouts: tuple[int, ...] = (),
    dense_queued: float = 0.0,
) -> list[Row]:
    inp = ffn_inputs(hidden, inter, epr, ep, device, tokens)
    x, weights, offsets, pairs, flops = inp.x, inp.weights, inp.offsets, inp.pairs, inp.flops
    base = dict(
        shape=name,
        ep=ep,
        experts_per_rank=epr,
        pairs=pairs,
        rows_per_expert=pairs / epr,
        max_group=inp.max_group,
    )
    rows = []
    want = None
    variants: dict[str, tuple[Callable[[], object] | None, str]] = {}
    triton_reason = unavailable_reason(device, hidden, inter)
    act = "triton" if device.type == "cuda" else "torch"  # the layer's activation (moelab's kernel on CUDA)
    for impl in ("loop", "grouped", "triton", "padded"):
        if impl == "grouped" and not hasattr(torch, "_grouped_mm"):
            variants[impl] = (None, "no torch._grouped_mm")
            continue
        if impl == "triton" and triton_reason:
            variants[impl] = (None, triton_reason)
            continue
        variants[impl] = (
            (lambda impl=impl: swiglu_ffn(x, offsets, weights, impl, act, max_group=inp.max_group)),
            "",
        )
    for held in carveouts:  # the same FFN launched under the carve-out an overlapped layer at sms = held sets
        for impl in ("grouped", "triton"):
            fn, _ = variants[impl]
            if fn is not None:
                variants[f"{impl}@{held}"] = (_carved(fn, held, device), f"{held} SMs held back")
    variants["fp8-grouped"] = fp8_variant(x, weights, offsets)
    if backward:  # forward+backward of the FFN: input and weight gradients (FLOPs: 3x forward)
        for impl in ("grouped", "triton"):
            if variants[impl][0] is not None:
                variants[f"{impl}+bwd"] = (train_step(x, weights, offsets, impl, act, inp.max_group), "")
    for variant, (fn, note) in variants.items():
        if fn is None:
            rows.append(
                Row(**base, variant=variant, us=None, tflops=None, pct_dense=None, kernels="", note=note)
            )
            continue
        with torch.no_grad() if not variant.endswith("+bwd") else contextlib.nullcontext():
            out = fn()
            if variant in ("loop", "grouped", "triton", "padded") or "@" in variant:
                if want is None:
                    want = out.float()
                else:
                    err = float((out.float() - want).norm() / want.norm().clamp(min=1e-12))
                    note = note or f"rel err vs loop {err:.2e}"
                    if err > 2e-2:
                        note = f"WRONG: rel err vs loop {err:.2e}"
            t = median_us(fn, device)
            gpu_t = queued_us(fn, device)
            paired = None
            if variant in ("loop", "grouped", "triton", "padded"):  # the acceptance's candidates
                paired = paired_pct_dense(fn, flops, device)
            kernels = "" if variant.endswith("+bwd") else "; ".join(k[:70] for k in gemm_kernels(fn)[:2])
        tf = (3 if variant.endswith("+bwd") else 1) * flops / (t * 1e-6) / 1e12
        rows.append(
            Row(
                **base,
                variant=variant,
                us=t,
                tflops=tf,
                pct_dense=tf / dense if dense else None,
                kernels=kernels,
                note=note,
                gpu_us=gpu_t,
                gpu_pct_dense=tf * t / gpu_t / dense_queued if dense_queued else None,
                paired_pct_dense=paired,
            )
        )
    return rows


def sm_counts(text: str) -> tuple[int, ...]:
    """--carveout: comma-separated SM counts, each a whole number above 0 (argparse says which is not)."""
    try:
        counts = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"SM counts must be whole numbers, got {text!r}") from None
    if any(c <= 0 for c in counts):
        raise argparse.ArgumentTypeError(f"SM counts must be above 0, got {text!r}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run on tiny shapes")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--backward", action="store_true", help="also time forward+backward (grouped, triton)")
    ap.add_argument(
        "--carveout",
        type=sm_counts,
        default=(),
        help="comma-separated SM counts: also grouped and triton with that many held back",
    )
    args = ap.parse_args()
    carveouts: tuple[int, ...] = args.carveout
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    t0 = time.time()
    n = 256 if args.tiny else DENSE_N  # --tiny: a small matmul, CPU
    dense = dense_tflops(device, n)
    dense_queued = dense_tflops(device, n, queued_us)
    sustained_s = 0.2 if args.tiny else SUSTAINED_S
    sustained = sustained_dense_tflops(device, n, sustained_s)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device {name}, torch {torch.__version__}; dense bf16 matmul {dense:.0f} TFLOP/s ({n}^3, median of {ITERS}; "
        f"{dense_queued:.0f} queued; {sustained:.0f} sustained, run back to back for {sustained_s:g} s)"
    )
    rows: list[Row] = []
    for shape in shapes(args.tiny):
        rows += bench_shape(
            *shape,
            device=device,
            dense=dense,
            tokens=64 if args.tiny else TOKENS,
            backward=args.backward,
            carveouts=carveouts,
            dense_queued=dense_queued,
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the shape's weights are gone: the next one gets the memory
    head = f"{'shape':16} {'EP':>2} {'E/rank':>6} {'rows/E':>7} {'max':>5} {'variant':12} {'us':>9} {'TF/s':>6} {'%dense':>6} {'gpu us':>9} {'%dense':>6} {'paired':>6}  kernel / note"
    print(head)
    print("-" * len(head))
    for r in rows:
        us = f"{r.us:9.1f}" if r.us is not None else f"{'-':>9}"
        tf = f"{r.tflops:6.0f}" if r.tflops is not None else f"{'-':>6}"
        pct = f"{100 * r.pct_dense:5.0f}%" if r.pct_dense is not None else f"{'-':>6}"
        gpu = f"{r.gpu_us:9.1f}" if r.gpu_us is not None else f"{'-':>9}"
        gpct = f"{100 * r.gpu_pct_dense:5.0f}%" if r.gpu_pct_dense is not None else f"{'-':>6}"
        paired = f"{100 * r.paired_pct_dense:5.0f}%" if r.paired_pct_dense is not None else f"{'-':>6}"
        print(
            f"{r.shape:16} {r.ep:>2} {r.experts_per_rank:>6} {r.rows_per_expert:7.0f} {r.max_group:>5} {r.variant:12} {us} {tf} {pct} {gpu} {gpct} {paired}  {r.kernels or ''} {r.note}"
        )
    print()
    for shape, need in (("deepseek-v3", 0.65), ("qwen3-235b-a22b", 0.65), ("reference", 0.80)):
        for ep in (2, 4):
            cand = [
                r
                for r in rows
                if r.shape == shape
                and r.ep == ep
                and r.pct_dense is not None
                and r.variant != "fp8-grouped"
                and not r.variant.endswith("+bwd")
                and "@" not in r.variant  # a carve-out's run holds SMs back on purpose
                and "WRONG" not in r.note
            ]
            if not cand:
                continue
            for reading, pct_of in (
                ("synced", lambda r: r.pct_dense or 0),
                ("queued", lambda r: r.gpu_pct_dense or 0),
                ("queued, of sustained dense", lambda r: (r.gpu_pct_dense or 0) * dense_queued / sustained),
                ("paired with dense", lambda r: r.paired_pct_dense or 0),
            ):
                best = max(cand, key=pct_of)
                ok = "MET" if pct_of(best) >= need else "NOT MET"
                print(
                    f"acceptance {shape} EP={ep} ({reading}): best bf16 {best.variant} {100 * pct_of(best):.0f}% of dense (need {100 * need:.0f}%): {ok}"
                )
    print(f"wall {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "dense_tflops": dense,
                    "dense_tflops_queued": dense_queued,
                    "dense_tflops_sustained": sustained,
                    "device": name,
                    "rows": [asdict(r) for r in rows],
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
