"""The @triton.jit kernels of moelab.measure.e2e.triton_kernels (which launches them): this module imports
triton at its top, so it is itself imported only on first use, never by moelab's import. Defined at module
level, as triton's JIT (and its interpreter) reads the `tl` they use from the module's globals."""

from __future__ import annotations

import triton
import triton.language as tl

next_power_of_2 = triton.next_power_of_2
cdiv = triton.cdiv


@triton.jit
def gather_rows(src, index, scale, dst, hidden, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """dst[i] = src[index[i]] (* scale[i] in float32)."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    row = tl.load(index + i)
    v = tl.load(src + row * hidden + cols, mask=mask, other=0.0)
    if HAS_SCALE:
        v = v.to(tl.float32) * tl.load(scale + i)
    tl.store(dst + i * hidden + cols, v.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def slot_sum(
    y, slot_pair, slot_weight, out, hidden, K: tl.constexpr, WEIGHTED: tl.constexpr, BLOCK: tl.constexpr
):
    """out[r] = sum over slots k of row r holding a pair p >= 0: w[r, k] * y[p], in float32."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(K):
        p = tl.load(slot_pair + r * K + k)
        v = tl.load(y + p * hidden + cols, mask=mask & (p >= 0), other=0.0).to(tl.float32)
        if WEIGHTED:
            v = v * tl.load(slot_weight + r * K + k)
        acc += v
    tl.store(out + r * hidden + cols, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_fwd(h, a, inter, BLOCK: tl.constexpr):
    """a[p] = silu(h[p, :I]) * h[p, I:]."""
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(h + p * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h + p * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(a + p * inter + cols, out.to(a.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd(h, grad_a, grad_h, inter, BLOCK: tl.constexpr):
    """grad_h[p, :I] = ga * u * silu'(g), grad_h[p, I:] = ga * silu(g)."""
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(h + p * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h + p * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    ga = tl.load(grad_a + p * inter + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    dg = ga * u * s * (1.0 + g * (1.0 - s))
    du = ga * g * s
    tl.store(grad_h + p * 2 * inter + cols, dg.to(grad_h.dtype.element_ty), mask=mask)
    tl.store(grad_h + p * 2 * inter + inter + cols, du.to(grad_h.dtype.element_ty), mask=mask)
