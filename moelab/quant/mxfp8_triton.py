"""moelab's fused MXFP8 kernels for Hopper (and Ada): one pass over the input, bits equal to `mxfp8.py`'s torch
implementation (same integer exponent rule, same clamp, round-to-nearest-even E4M3 by the hardware's
`cvt.rn.satfinite` conversion, 0x7F for every element of a NaN/inf block).

Imported only when a CUDA tensor asks for it (`mxfp8.quantize_mxfp8(impl="triton"|"auto")`). Each program
quantizes a tile of BLOCK_ROWS rows x BLOCKS_PER_TILE blocks, addressed as [rows, blocks, 32]; the output row
strides are free, so the data and scales can land as column slices of one packed row buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moelab.quant.mx_format import ROUND_UP_ABOVE

BLOCK = 32


@triton.jit
def _quantize_kernel(
    x_ptr,
    data_ptr,
    scale_ptr,
    n_rows,
    n_blocks,
    stride_x,
    stride_data,
    stride_scale,
    ROUND_UP_ABOVE: tl.constexpr,  # mxfp8.ROUND_UP_ABOVE[rounding]: exponent + 1 above these mantissa bits
    BLOCK_ROWS: tl.constexpr,
    BLOCKS_PER_TILE: tl.constexpr,
):
    # tiles are addressed as [rows, blocks, 32] directly: no reshape, so no layout conversion
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    blocks = tl.program_id(1) * BLOCKS_PER_TILE + tl.arange(0, BLOCKS_PER_TILE)
    rows3 = rows.to(tl.int64)[:, None, None]
    cols3 = blocks[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    bmask = (rows[:, None] < n_rows) & (blocks[None, :] < n_blocks)
    mask = bmask[:, :, None]
    x = tl.load(x_ptr + rows3 * stride_x + cols3, mask=mask, other=0.0).to(tl.float32)

    mag = tl.abs(x)
    mag = tl.where(mag == mag, mag, float("inf"))  # NaN counts as inf: both poison the block
    amax = tl.max(mag, axis=2)
    bits = amax.to(tl.int32, bitcast=True)
    ebits = (bits >> 23) & 0xFF
    byte = ebits - 8 + ((bits & 0x7FFFFF) > ROUND_UP_ABOVE).to(tl.int32)
    byte = tl.maximum(byte, 0)
    nan_block = ebits == 0xFF
    byte = tl.where(nan_block, 0xFF, byte)

    rcp = (tl.maximum(254 - byte, 1) << 23).to(tl.float32, bitcast=True)
    y = x * rcp[:, :, None]
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    q = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    q = tl.where(nan_block[:, :, None], 0x7F, q).to(tl.uint8)
    tl.store(data_ptr + rows3 * stride_data + cols3, q, mask=mask)
    srows = rows.to(tl.int64)[:, None]
    tl.store(scale_ptr + srows * stride_scale + blocks[None, :], byte.to(tl.uint8), mask=bmask)


@triton.jit
def _dequantize_kernel(
    data_ptr,
    scale_ptr,
    out_ptr,
    n_rows,
    n_blocks,
    stride_data,
    stride_scale,
    stride_out,
    BLOCK_ROWS: tl.constexpr,
    BLOCKS_PER_TILE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    blocks = tl.program_id(1) * BLOCKS_PER_TILE + tl.arange(0, BLOCKS_PER_TILE)
    rows3 = rows.to(tl.int64)[:, None, None]
    cols3 = blocks[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    bmask = (rows[:, None] < n_rows) & (blocks[None, :] < n_blocks)
    mask = bmask[:, :, None]
    q = tl.load(data_ptr + rows3 * stride_data + cols3, mask=mask, other=0)
    v = q.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    srows = rows.to(tl.int64)[:, None]
    byte = tl.load(scale_ptr + srows * stride_scale + blocks[None, :], mask=bmask, other=127).to(tl.int32)
    sbits = tl.where(byte == 0, 0x00400000, byte << 23)
    sbits = tl.where(byte == 0xFF, 0x7FC00000, sbits)
    scale = sbits.to(tl.float32, bitcast=True)
    out = v * scale[:, :, None]
    tl.store(out_ptr + rows3 * stride_out + cols3, out.to(out_ptr.dtype.element_ty), mask=mask)


def _tile(n_cols: int, block_rows: int | None, block_cols: int | None) -> tuple[int, int]:
    bc = block_cols or min(1024, triton.next_power_of_2(n_cols))
    br = block_rows or max(1, 4096 // bc)
    assert bc % BLOCK == 0 and bc & (bc - 1) == 0, "BLOCK_COLS must be a power of two >= 32"
    return br, bc


def _rows_2d(t: torch.Tensor) -> torch.Tensor:
    """[..., C] with unit last stride -> [N, C] view (no copy when the leading dims are uniformly strided)."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


def quantize(
    x: torch.Tensor,
    rounding: str,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_rows: int | None = None,
    block_cols: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = _rows_2d(x)
    n_rows, n_cols = x2.shape
    if out is None:
        data = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        scales = torch.empty(*x.shape[:-1], n_cols // BLOCK, dtype=torch.uint8, device=x.device)
    else:
        data, scales = out
    d2 = data if data.dim() == 2 else data.view(n_rows, n_cols)
    s2 = scales if scales.dim() == 2 else scales.view(n_rows, n_cols // BLOCK)
    assert d2.stride(-1) == 1 and s2.stride(-1) == 1, "outputs need unit stride along the last dimension"
    if n_rows == 0:
        return data, scales
    br, bc = _tile(n_cols, block_rows, block_cols)
    grid = (triton.cdiv(n_rows, br), triton.cdiv(n_cols, bc))
    _quantize_kernel[grid](
        x2,
        d2,
        s2,
        n_rows,
        n_cols // BLOCK,
        x2.stride(0),
        d2.stride(0),
        s2.stride(0),
        ROUND_UP_ABOVE=ROUND_UP_ABOVE[rounding],
        BLOCK_ROWS=br,
        BLOCKS_PER_TILE=bc // BLOCK,
        num_warps=num_warps or (8 if br * bc >= 8192 else 4),
    )
    return data, scales


def dequantize(
    data: torch.Tensor,
    scales: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
    block_rows: int | None = None,
    block_cols: int | None = None,
) -> torch.Tensor:
    n_cols = data.shape[-1]
    d2 = data if data.dim() == 2 else data.reshape(-1, n_cols)
    s2 = scales if scales.dim() == 2 else scales.reshape(-1, n_cols // BLOCK)
    n_rows = d2.shape[0]
    result = torch.empty(data.shape, dtype=out_dtype, device=data.device) if out is None else out
    o2 = result if result.dim() == 2 else result.view(n_rows, n_cols)
    assert d2.stride(-1) == 1 and s2.stride(-1) == 1 and o2.stride(-1) == 1, "need unit last strides"
    if n_rows == 0:
        return result
    br, bc = _tile(n_cols, block_rows, block_cols)
    grid = (triton.cdiv(n_rows, br), triton.cdiv(n_cols, bc))
    _dequantize_kernel[grid](
        d2,
        s2,
        o2,
        n_rows,
        n_cols // BLOCK,
        d2.stride(0),
        s2.stride(0),
        o2.stride(0),
        BLOCK_ROWS=br,
        BLOCKS_PER_TILE=bc // BLOCK,
        num_warps=8 if br * bc >= 8192 else 4,
    )
    return result
