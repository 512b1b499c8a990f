"""The @triton.jit kernels of moelab.measure.e2e.triton_kernels (which launches them): this module imports
triton at its top, so it is itself imported only on first use, never by moelab's import. Defined at module
level, as triton's JIT (and its interpreter) reads the `tl` they use from the module's globals.

Each program owns a tile of BLOCK_R output rows by BLOCK_C columns: a tile of several short rows keeps
enough bytes in flight per program for memory-bound steps at hidden 2880-8192. On CUDA the tile is
autotuned per row width (the `*_tuned` kernels); every tile computes each output element the same way, so
the result is bitwise the same whichever tile is chosen. Under triton's interpreter (the CPU tests) the
plain kernels run with one fixed tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

next_power_of_2 = triton.next_power_of_2
cdiv = triton.cdiv

TILES = (  # (BLOCK_R, BLOCK_C, num_warps) tried per row width
    (1, 1024, 4),
    (2, 1024, 4),
    (4, 1024, 8),
    (8, 512, 8),
    (4, 512, 4),
    (16, 256, 8),
    (1, 2048, 8),
    (2, 2048, 8),
)
CONFIGS = [triton.Config({"BLOCK_R": r, "BLOCK_C": c}, num_warps=w) for r, c, w in TILES]


@triton.jit
def gather_rows(
    src, index, scale, dst, n, hidden, HAS_SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    """dst[i] = src[index[i]] (* scale[i] in float32)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < n
    mask = rmask[:, None] & (cols < hidden)[None, :]
    src_rows = tl.load(index + rows, mask=rmask, other=0).to(tl.int64)
    v = tl.load(src + src_rows[:, None] * hidden + cols[None, :], mask=mask, other=0.0)
    if HAS_SCALE:
        v = v.to(tl.float32) * tl.load(scale + rows, mask=rmask, other=0.0)[:, None]
    tl.store(dst + rows.to(tl.int64)[:, None] * hidden + cols[None, :], v.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def slot_sum(
    y,
    slot_pair,
    slot_weight,
    out,
    rows_n,
    hidden,
    K: tl.constexpr,
    WEIGHTED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """out[r] = sum over slots k of row r holding a pair p >= 0: w[r, k] * y[p], in float32, slot after slot."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < rows_n
    cmask = (cols < hidden)[None, :]
    r64 = rows.to(tl.int64)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(K):
        p = tl.load(slot_pair + r64 * K + k, mask=rmask, other=-1)
        v = tl.load(y + p[:, None] * hidden + cols[None, :], mask=(p >= 0)[:, None] & cmask, other=0.0)
        v = v.to(tl.float32)
        if WEIGHTED:
            v = v * tl.load(slot_weight + r64 * K + k, mask=rmask, other=0.0)[:, None]
        acc += v
    tl.store(
        out + r64[:, None] * hidden + cols[None, :], acc.to(out.dtype.element_ty), mask=rmask[:, None] & cmask
    )


@triton.jit
def swiglu_fwd(h, a, pairs, inter, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """a[p] = silu(h[p, :I]) * h[p, I:]."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < pairs)[:, None] & (cols < inter)[None, :]
    base = h + rows[:, None] * 2 * inter + cols[None, :]
    g = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(base + inter, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(a + rows[:, None] * inter + cols[None, :], out.to(a.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd(h, grad_a, grad_h, pairs, inter, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """grad_h[p, :I] = ga * u * silu'(g), grad_h[p, I:] = ga * silu(g)."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < pairs)[:, None] & (cols < inter)[None, :]
    base = rows[:, None] * 2 * inter + cols[None, :]
    g = tl.load(h + base, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h + base + inter, mask=mask, other=0.0).to(tl.float32)
    ga = tl.load(grad_a + rows[:, None] * inter + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    dg = ga * u * s * (1.0 + g * (1.0 - s))
    du = ga * g * s
    tl.store(grad_h + base, dg.to(grad_h.dtype.element_ty), mask=mask)
    tl.store(grad_h + base + inter, du.to(grad_h.dtype.element_ty), mask=mask)


gather_rows_tuned = triton.autotune(configs=CONFIGS, key=["hidden", "HAS_SCALE"])(gather_rows)
slot_sum_tuned = triton.autotune(configs=CONFIGS, key=["hidden", "K", "WEIGHTED"])(slot_sum)
swiglu_fwd_tuned = triton.autotune(configs=CONFIGS, key=["inter"])(swiglu_fwd)
swiglu_bwd_tuned = triton.autotune(configs=CONFIGS, key=["inter"])(swiglu_bwd)
