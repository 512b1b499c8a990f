"""The @triton.jit grouped GEMM of moelab.measure.e2e.grouped_gemm (which launches it). This module imports
triton at its top, so it is imported only on first use, never by moelab's import.

One program computes one output tile of one expert: BLOCK_M rows of the expert's group by BLOCK_N columns,
reading its rows and the expert's weights through TMA descriptors. What makes it faster than
torch._grouped_mm's CUTLASS kernel where experts have a few hundred rows (issue 37; results/h200x2-r13):

- program ids run over an expert's row tiles first, then its column tiles: the 2-3 programs that read the
  same weight tile run side by side and share it in L2, so each weight byte comes from HBM about once
  (with columns first, the DeepSeek-V3 shape at EP = 2 took 7% longer on H200);
- SWIGLU: the first GEMM computes a tile's gate columns and the matching up columns together and writes
  silu(gate) * up, so h is never written and read back (written only where backward needs it, KEEP_H);
- a group's last row tile with at most BLOCK_M / 2 rows may run half-height (at 256 +- 16 rows per
  expert about half the experts end in a tile of a few rows); the autotuner keeps it or not per shape.

Rows past a group's end that a TMA load reads belong to the next group (or lie past the tensor, read as
zeros); the store is masked to the group's rows, so they are never written. Columns and the reduction past
the weights' edge are zero-filled by the descriptors. Every tile sums its products in the same order (K
steps of BLOCK_K), so the result does not depend on which tile height or pipeline depth ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

cdiv = triton.cdiv


@triton.jit
def _tile(
    a_desc,
    w_desc,
    row0,
    e,
    n0,
    KR: tl.constexpr,
    TRANS_W: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, KR, BK):
        a = a_desc.load([row0, k])
        if TRANS_W:  # w [E, N, KR]: the expert's [BN, BK] block, used transposed
            b = w_desc.load([e, n0, k]).reshape(BN, BK)
            acc = tl.dot(a, b.T, acc)
        else:  # w [E, KR, N]
            b = w_desc.load([e, k, n0]).reshape(BK, BN)
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _gate_up_tile(
    a_desc,
    w_desc,
    row0,
    e,
    n0,
    INTER: tl.constexpr,
    KR: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """The gate columns n0.. and the up columns INTER + n0.. of the same rows, each [BM, BN]."""
    g = tl.zeros((BM, BN), dtype=tl.float32)
    u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, KR, BK):
        a = a_desc.load([row0, k])
        g = tl.dot(a, w_desc.load([e, k, n0]).reshape(BK, BN), g)
        u = tl.dot(a, w_desc.load([e, k, INTER + n0]).reshape(BK, BN), u)
    return g, u


@triton.jit
def _store(out, acc, row0, end, n0, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    rows = row0 + tl.arange(0, BM)
    cols = n0 + tl.arange(0, BN)
    mask = (rows < end)[:, None] & (cols < N)[None, :]
    tl.store(out + rows.to(tl.int64)[:, None] * N + cols[None, :], acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _store_swiglu(
    out, h, g, u, row0, end, n0, INTER: tl.constexpr, KEEP_H: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    """a = silu(g) * u from g and u rounded to the output's dtype (the bits the unfused GEMM would have
    written to h and the activation kernel read back); h itself too where backward needs it."""
    rows = row0 + tl.arange(0, BM)
    cols = n0 + tl.arange(0, BN)
    mask = (rows < end)[:, None] & (cols < INTER)[None, :]
    gr = g.to(out.dtype.element_ty)
    ur = u.to(out.dtype.element_ty)
    gf = gr.to(tl.float32)
    act = gf * tl.sigmoid(gf) * ur.to(tl.float32)
    r64 = rows.to(tl.int64)[:, None]
    tl.store(out + r64 * INTER + cols[None, :], act.to(out.dtype.element_ty), mask=mask)
    if KEEP_H:
        tl.store(h + r64 * (2 * INTER) + cols[None, :], gr, mask=mask)
        tl.store(h + r64 * (2 * INTER) + INTER + cols[None, :], ur, mask=mask)


@triton.jit
def _group_tile(
    pid,
    a_desc,
    a_half_desc,
    w_desc,
    out,
    h,
    ends,
    row_tiles,
    col_tiles,
    N: tl.constexpr,
    KR: tl.constexpr,
    TRANS_W: tl.constexpr,
    SWIGLU: tl.constexpr,
    KEEP_H: tl.constexpr,
    HALF_TAIL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Output tile `pid`: the expert's row tiles first, then its column tiles (see the module docstring)."""
    m_t = pid % row_tiles
    rest = pid // row_tiles
    n_t = rest % col_tiles
    e = rest // col_tiles
    start = tl.where(e > 0, tl.load(ends + tl.maximum(e - 1, 0)), 0)
    end = tl.load(ends + e)
    row0 = start + m_t * BLOCK_M
    left = end - row0
    n0 = n_t * BLOCK_N
    if left > BLOCK_M // 2 or (not HALF_TAIL and left > 0):
        if SWIGLU:
            g, u = _gate_up_tile(a_desc, w_desc, row0, e, n0, N, KR, BLOCK_M, BLOCK_N, BLOCK_K)
            _store_swiglu(out, h, g, u, row0, end, n0, N, KEEP_H, BLOCK_M, BLOCK_N)
        else:
            acc = _tile(a_desc, w_desc, row0, e, n0, KR, TRANS_W, BLOCK_M, BLOCK_N, BLOCK_K)
            _store(out, acc, row0, end, n0, N, BLOCK_M, BLOCK_N)
    elif left > 0:
        if SWIGLU:
            g, u = _gate_up_tile(a_half_desc, w_desc, row0, e, n0, N, KR, BLOCK_M // 2, BLOCK_N, BLOCK_K)
            _store_swiglu(out, h, g, u, row0, end, n0, N, KEEP_H, BLOCK_M // 2, BLOCK_N)
        else:
            acc = _tile(a_half_desc, w_desc, row0, e, n0, KR, TRANS_W, BLOCK_M // 2, BLOCK_N, BLOCK_K)
            _store(out, acc, row0, end, n0, N, BLOCK_M // 2, BLOCK_N)


@triton.jit
def triton_grouped_gemm(
    a_desc,
    a_half_desc,
    w_desc,
    out,
    h,
    ends,
    experts,
    max_group,
    rows_key,
    next_tile,
    N: tl.constexpr,
    KR: tl.constexpr,
    TRANS_W: tl.constexpr,
    SWIGLU: tl.constexpr,
    KEEP_H: tl.constexpr,
    HALF_TAIL: tl.constexpr,
    PERSISTENT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[rows of group e] = a[rows of group e] @ w[e] (w[e]^T with TRANS_W); `ends` [E] int32 cumulative
    row ends of the `experts` groups, the largest of `max_group` rows. SWIGLU: w is [E, KR, 2N] (gate, up),
    out the activation [P, N] (N = I) and, with KEEP_H, h [P, 2N] the GEMM's output. `rows_key` is read by
    the autotuner only (the largest group's rows to a power of two: one tuning per size class).

    The output tiles: the BLOCK_M row tiles of the largest group, by the BLOCK_N column tiles of N, by the
    experts (`_group_tile` orders them). PERSISTENT: the grid is fewer programs than tiles (the SMs a
    carve-out leaves the GEMMs), each taking the next tile from the counter `next_tile` (one int32, zero at
    launch) until none is left: like torch's carved-out GEMMs, it then leaves the SMs held back for the
    communication beside it free. The tiles in flight are always the next few in order, as when the hardware
    hands one program per tile to SMs as they free up, so the 2-3 tiles that read one weight tile still run
    side by side and share it in L2. (A fixed stride of tiles per program drifts apart, since empty and
    half-height tiles end early: at DeepSeek-V3's shape on 4 x H200 it cost 28% under an 8-SM carve-out,
    results/h200x4-r16/sms2.) Each tile is computed as without it."""
    row_tiles = tl.cdiv(max_group, BLOCK_M)
    col_tiles = tl.cdiv(N, BLOCK_N)
    tiles = experts * col_tiles * row_tiles
    if PERSISTENT:
        t = tl.atomic_add(next_tile, 1, sem="relaxed")
        while t < tiles:  # a while, not a range: triton's interpreter takes no tensor range bounds
            _group_tile(
                t, a_desc, a_half_desc, w_desc, out, h, ends, row_tiles, col_tiles,
                N, KR, TRANS_W, SWIGLU, KEEP_H, HALF_TAIL, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
            t = tl.atomic_add(next_tile, 1, sem="relaxed")
    else:
        _group_tile(
            tl.program_id(0), a_desc, a_half_desc, w_desc, out, h, ends, row_tiles, col_tiles,
            N, KR, TRANS_W, SWIGLU, KEEP_H, HALF_TAIL, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip


def set_blocks(nargs: dict[str, Any]) -> None:
    """The descriptors' boxes to the launch's blocks (a Config's pre_hook: the tile shape is tuned)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["a_half_desc"].block_shape = [bm // 2, bk]
    nargs["w_desc"].block_shape = [1, bn, bk] if nargs["TRANS_W"] else [1, bk, bn]


def _config(blocks: tuple[int, int, int], stages: int, half: bool) -> triton.Config:
    m, n, k = blocks
    return triton.Config(
        {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "HALF_TAIL": half},
        num_warps=8,
        num_stages=stages,
        pre_hook=set_blocks,
    )


# Tried per shape on CUDA: the tile, the pipeline depth and whether a short last tile runs half-height. None
# changes a result bit: each output element sums the same k16 products in the same order. The fused SwiGLU
# GEMM holds two accumulators, so its tile is 128 gate by 128 up columns. The plain GEMM (fc2 and every
# input gradient) also tries 128 x 256 in K steps of 32 with six stages, and 256 x 128: on one H200, in GPU
# time, they came within 4% of 128 x 256 x 64 either way at the DeepSeek-V3, Qwen3 and reference shapes
# (benchmarks/triton_gemm_tiles.py, results/h200x1-r18), and the autotuner keeps them where they win (the
# reference's 2048-4096-row classes chose 256 x 128 x 64 in some cases of the acceptance run).
SWIGLU_TUNED = [_config((128, 128, 64), stages, half) for stages in (3, 4) for half in (True, False)]
PLAIN_TUNED = [
    _config((128, 256, 64), 3, True),
    _config((128, 256, 64), 4, True),
    _config((128, 256, 64), 4, False),
    _config((128, 256, 32), 6, True),
    _config((128, 256, 32), 6, False),
    _config((256, 128, 64), 4, True),
    _config((256, 128, 64), 4, False),
]


def _kind(configs: list[triton.Config], nargs: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    return SWIGLU_TUNED if kwargs["SWIGLU"] else PLAIN_TUNED


QUEUED_WARMUP, QUEUED_REPS = 3, 20


def queued_bench(fn: Callable[[], object], quantiles: tuple[float, ...]) -> list[float]:
    """The autotuner's timing of a config (ms at `quantiles`): launches queued back to back, an event pair
    around each, one sync at the end, and no L2 flush between them, as the layer runs its GEMMs.
    triton's do_bench flushes L2 before every launch; at 256-512 rows per expert that ranked the configs
    differently, and the autotuner chose fc2 configs 6-22% slower than the fastest of its own list on one
    H200 (benchmarks/triton_gemm_tiles.py, results/h200x1-r18)."""
    import torch  # the kernel module imports no torch at its top; the layer has it loaded

    for _ in range(QUEUED_WARMUP):
        fn()
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(QUEUED_REPS)
    ]
    torch.cuda.synchronize()
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = torch.tensor([start.elapsed_time(end) for start, end in pairs])
    return [float(torch.quantile(times, q)) for q in quantiles]


triton_grouped_gemm_tuned = triton.autotune(
    configs=SWIGLU_TUNED + PLAIN_TUNED,
    key=["N", "KR", "TRANS_W", "SWIGLU", "KEEP_H", "PERSISTENT", "rows_key"],
    prune_configs_by={"early_config_prune": _kind},
    reset_to_zero=["next_tile"],  # the persistent grid's counter, before each timed launch
    do_bench=queued_bench,
)(triton_grouped_gemm)
