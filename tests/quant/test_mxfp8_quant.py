"""MXFP8 quantizer: torch implementation == float64 spec reference bit for bit, torchao's RCEIL rule, special
values, round-trip error bounds; the Triton kernel on the GPU (and its indexing under Triton's interpreter)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.errors import BackendUnavailable, SpecError
from moelab.quant import mxfp8
from moelab.quant.mxfp8 import (
    dequantize_mxfp8,
    quantize_mxfp8,
    quantize_mxfp8_torch,
    reference_dequantize_mxfp8,
    reference_quantize_mxfp8,
)

ROOT = Path(__file__).resolve().parents[2]


def all_bf16_values() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def blocks_led_by(values: torch.Tensor) -> torch.Tensor:
    """One 32-block per value: the value, a scaled copy, and a ramp below it (all in the value's dtype)."""
    x = torch.zeros(values.numel(), 32, dtype=torch.float64)
    v = values.double().unsqueeze(1)
    x[:, :1] = v
    x[:, 1:] = v * torch.linspace(-0.97, 0.011, 31, dtype=torch.float64)
    return torch.where(torch.isfinite(v), x, v.expand_as(x)).to(values.dtype)


def torchao_rceil_scale(amax: torch.Tensor) -> torch.Tensor:
    """torchao's RCEIL as its eager `_to_mx_rceil` computes it: float32(amax * float32(1/448)), exponent up."""
    descale = amax.float() * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    bits = descale.view(torch.int32)
    biased, mant = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = torch.where(biased == 0, mant > 0x400000, mant != 0)
    byte = biased + up.to(torch.int32)
    return torch.where(torch.isfinite(descale), byte, torch.full_like(byte, 255)).to(torch.uint8)


def assert_bits_equal(x: torch.Tensor, rounding: str) -> None:
    data, scales = quantize_mxfp8_torch(x, rounding)
    ref_data, ref_scales = reference_quantize_mxfp8(x, rounding)
    assert data.dtype == scales.dtype == torch.uint8
    assert scales.shape == (*x.shape[:-1], x.shape[-1] // 32)
    assert torch.equal(scales, ref_scales), (scales != ref_scales).nonzero()[:5]
    assert torch.equal(data, ref_data), (data != ref_data).nonzero()[:5]


# ---- bit exactness -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_every_bf16_value_matches_reference(rounding: str) -> None:
    assert_bits_equal(blocks_led_by(all_bf16_values()), rounding)


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_every_fp16_value_matches_reference(rounding: str) -> None:
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    assert_bits_equal(blocks_led_by(values), rounding)


def test_rceil_equals_torchao_for_every_bf16_and_fp16_amax() -> None:
    for values in (
        all_bf16_values(),
        torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16),
    ):
        x = blocks_led_by(values)
        _, scales = quantize_mxfp8_torch(x, "rceil")
        amax = x.float().abs().amax(dim=-1, keepdim=True)
        assert torch.equal(scales, torchao_rceil_scale(amax))


def test_rceil_fp32_differs_from_torchao_only_at_one_value() -> None:
    """float32 amax a few ulps either side of 448 * 2^k for every k: torchao's float32 product rounds
    448 * 2^-127 + 1 ulp down to the subnormal 2^-127 (byte 0); the spec and moelab give byte 1."""
    centre = torch.tensor([448.0 * 2.0**k for k in range(-150, 120)], dtype=torch.float32)
    bits = centre.view(torch.int32).unsqueeze(1) + torch.arange(-3, 4, dtype=torch.int32)
    amax = bits.reshape(-1).view(torch.float32)
    amax = amax[torch.isfinite(amax) & (amax > 0)]
    ours = mxfp8.scale_bytes_from_amax(amax, "rceil").to(torch.uint8)
    ref = (mxfp8.reference_scale_exponent(amax.double(), "rceil").clamp(-127, 128) + 127).to(torch.uint8)
    assert torch.equal(ours, ref)
    differs = ours != torchao_rceil_scale(amax.unsqueeze(1)).squeeze(1)
    one_ulp_above = torch.tensor(448.0 * 2.0**-127, dtype=torch.float32).view(torch.int32) + 1
    assert amax[differs].view(torch.int32).tolist() == [one_ulp_above.item()]
    assert ours[differs].tolist() == [1]


finite_f32 = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True, width=32)
any_float = st.one_of(
    finite_f32,
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 448.0, -448.0, 2.0**-133, -(2.0**-149)]),
)


@settings(max_examples=200, deadline=None)
@given(
    lead=st.lists(st.integers(0, 3), min_size=0, max_size=2),
    num_blocks=st.integers(1, 4),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    rounding=st.sampled_from(mxfp8.ROUNDINGS),
    data=st.data(),
)
@pytest.mark.slow
def test_random_shapes_and_values_match_reference(lead, num_blocks, dtype, rounding, data) -> None:
    shape = (*lead, num_blocks * 32)
    n = math.prod(shape)
    exponent_span = data.draw(st.integers(0, 60))
    values = data.draw(st.lists(any_float, min_size=n, max_size=n))
    x = torch.tensor(values, dtype=torch.float64).reshape(shape)
    if exponent_span and n:  # also a wide dynamic range inside each block
        x = x * torch.pow(2.0, torch.randint(-exponent_span, exponent_span + 1, shape, dtype=torch.float64))
    x = x.to(dtype)
    assert_bits_equal(x, rounding)
    if dtype != torch.float32 and rounding == "rceil" and n:  # float32: see the window test above
        _, scales = quantize_mxfp8_torch(x, rounding)
        amax = x.float().reshape(*shape[:-1], num_blocks, 32).abs().amax(-1, keepdim=True)
        assert torch.equal(scales, torchao_rceil_scale(amax).squeeze(-1))


# ---- special values, as documented in moelab/quant/mxfp8.py ------------------------------------------


def quantize_one_block(values: list[float], rounding: str = "rceil") -> tuple[list[int], int]:
    x = torch.tensor(values + [0.0] * (32 - len(values)), dtype=torch.float32).to(torch.bfloat16)
    data, scales = quantize_mxfp8(x, rounding, "torch")
    return data.tolist(), int(scales.item())


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_zeros_block(rounding: str) -> None:
    data, scale = quantize_one_block([0.0, -0.0, 0.0], rounding)
    assert scale == 0 and data[:3] == [0x00, 0x80, 0x00] and set(data[3:]) == {0}
    out = dequantize_mxfp8(torch.tensor(data, dtype=torch.uint8), torch.tensor([scale], dtype=torch.uint8))
    assert torch.equal(out.float().abs(), torch.zeros(32)) and bool(torch.signbit(out[1]))


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_subnormal_block_round_trips(rounding: str) -> None:
    tiny = [2.0**-133, -(2.0**-130), 3 * 2.0**-133, 2.0**-127]  # bf16 subnormals, few significant bits
    data, scale = quantize_one_block(tiny, rounding)
    assert scale == 0
    out = dequantize_mxfp8(torch.tensor(data, dtype=torch.uint8), torch.tensor([scale], dtype=torch.uint8))
    assert out[:4].float().tolist() == tiny


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_plus_minus_448_exact(rounding: str) -> None:
    for k in (-100, 0, 7, 100):
        data, scale = quantize_one_block([448.0 * 2.0**k, -448.0 * 2.0**k, 2.0**k], rounding)
        if rounding == "ceil":  # ceil(log2(448 2^k)) - 8 = k + 1: the element is 224 = 1.75 * 2^7
            assert scale == 128 + k and data[:2] == [0x76, 0xF6]
        else:
            assert scale == 127 + k and data[:2] == [0x7E, 0xFE]
        out = dequantize_mxfp8(
            torch.tensor(data, dtype=torch.uint8), torch.tensor([scale], dtype=torch.uint8)
        )
        assert out[:3].float().tolist() == [448.0 * 2.0**k, -448.0 * 2.0**k, 2.0**k]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_inf_and_nan_poison_only_their_block(bad: float) -> None:
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    x[0, 5] = bad
    data, scales = quantize_mxfp8(x, "rceil", "torch")
    assert scales.tolist() == [[0xFF, 127 - 8], [127 - 8, 127 - 8]]
    assert set(data[0, :32].tolist()) == {0x7F} and set(data[0, 32:].tolist()) == {0x78}  # 1 * 2^8 = 256
    out = dequantize_mxfp8(data, scales)
    assert (
        torch.isnan(out[0, :32]).all() and torch.equal(out[0, 32:], x[0, 32:]) and torch.equal(out[1], x[1])
    )


def test_rounding_past_float_max_gives_inf() -> None:
    x = torch.full((32,), 3.39e38, dtype=torch.float32).to(torch.bfloat16)
    data, scales = quantize_mxfp8(x, "rceil", "torch")
    assert int(scales.item()) == 247 and torch.isinf(dequantize_mxfp8(data, scales)).all()


def test_floor_saturates_where_rceil_does_not() -> None:
    x = [1.875, 1.0]  # amax mantissa above 1.75: FLOOR's 2^-8 scale puts 1.875 at 480 > 448
    floor_data, floor_scale = quantize_one_block(x, "floor")
    rceil_data, rceil_scale = quantize_one_block(x, "rceil")
    assert (floor_scale, rceil_scale) == (127 - 8, 127 - 7)
    assert floor_data[0] == 0x7E  # saturated to 448 -> 1.75 after scaling back
    assert mxfp8.e4m3_byte_values()[rceil_data[0]].item() * 2.0**-7 == 1.875  # exact: 240 is E4M3


def test_default_is_rceil() -> None:
    x = torch.tensor([1.9375] + [0.0] * 31).to(torch.bfloat16)
    assert torch.equal(quantize_mxfp8(x)[1], quantize_mxfp8(x, "rceil", "torch")[1])
    assert not torch.equal(quantize_mxfp8(x)[1], quantize_mxfp8(x, "floor", "torch")[1])


# ---- round-trip error bounds -------------------------------------------------------------------------


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_round_trip_error_bound(rounding: str) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(256, 512, generator=gen) * torch.pow(
        2.0, torch.randint(-20, 20, (256, 16, 1), generator=gen)
    ).repeat_interleave(32, 1).squeeze(-1)
    x = x.to(torch.bfloat16)
    data, scales = quantize_mxfp8(x, rounding, "torch")
    out = dequantize_mxfp8(data, scales, torch.float32).double()
    xd = x.double()
    s = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    # E4M3 keeps 3 mantissa bits: half an ulp is <= 2^-4 of the value; below 2^-6 * s the spacing is 2^-9 * s
    bound = torch.maximum(xd.abs() * 2.0**-4, s * 2.0**-10)
    amax = xd.reshape(256, 16, 32).abs().amax(-1)
    if rounding in ("floor", "even"):
        bound = bound + (xd.abs() - 448 * s).clamp(min=0)  # saturation at +-448 s
    else:
        assert torch.all(xd.abs() <= 448 * s)
    if rounding == "rceil":  # the smallest power of two that fits the block maximum
        assert torch.all(amax > 448 * torch.pow(2.0, scales.double() - 128))
    if rounding == "ceil":  # the smallest power of two that keeps the block maximum at or below 256
        assert torch.all(amax <= 256 * torch.pow(2.0, scales.double() - 127))
        assert torch.all(amax > 256 * torch.pow(2.0, scales.double() - 128))
    assert torch.all((out - xd).abs() <= bound)
    rel = ((out - xd).norm() / xd.norm()).item()
    assert rel < (0.04 if rounding == "rceil" else 0.06)


def test_dequantize_matches_reference_and_fp8_view() -> None:
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (8, 64), dtype=torch.uint8, generator=gen)
    data[data & 0x7F == 0x7F] = 0  # no E4M3 NaN elements
    scales = torch.randint(0, 255, (8, 2), dtype=torch.uint8, generator=gen)
    out = dequantize_mxfp8(data, scales, torch.float32, "torch")
    # every product is exact in float32 (4 significant bits, >= 2^-136) or overflows to inf in both
    assert torch.equal(out, reference_dequantize_mxfp8(data, scales).float())
    assert torch.equal(dequantize_mxfp8(data, scales), out.to(torch.bfloat16))
    via_view = data.view(torch.float8_e4m3fn).float().reshape(8, 2, 32) * mxfp8.scale_value(scales).unsqueeze(
        -1
    )
    assert torch.equal(out, via_view.reshape(8, 64))


# ---- the dispatcher ----------------------------------------------------------------------------------


def test_dispatcher_on_cpu_runs_torch_and_refuses_gpu_impls() -> None:
    assert mxfp8.resolve_impl("auto", "cpu") == "torch"
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailable, match="CUDA"):
        quantize_mxfp8(x, impl="triton")
    with pytest.raises(BackendUnavailable):
        quantize_mxfp8(x, impl="torchao")
    with pytest.raises(SpecError, match="divisible by 32"):
        quantize_mxfp8(torch.randn(4, 48))
    with pytest.raises(SpecError, match="rounding"):
        quantize_mxfp8(x, rounding="nearest")
    with pytest.raises(SpecError, match="quantizer"):
        quantize_mxfp8(x, impl="cuda")
    with pytest.raises(SpecError, match="bf16, fp16 or fp32"):
        quantize_mxfp8(x.double())


def test_out_writes_into_packed_columns() -> None:
    x = torch.randn(5, 96, dtype=torch.bfloat16)
    width = mxfp8.packed_row_bytes(96)
    assert width == 96 + 3 + 1
    packed = torch.full((5, width), 0xAA, dtype=torch.uint8)
    data, scales = quantize_mxfp8(x, out=(packed[:, :96], packed[:, 96:99]))
    ref_data, ref_scales = quantize_mxfp8_torch(x)
    assert torch.equal(packed[:, :96], ref_data) and torch.equal(packed[:, 96:99], ref_scales)
    assert set(packed[:, 99].tolist()) == {0xAA}
    out = torch.empty(5, 96, dtype=torch.bfloat16)
    assert dequantize_mxfp8(data, scales, out=out) is out
    assert torch.equal(out, dequantize_mxfp8(ref_data, ref_scales))


# ---- Triton: bits on a GPU; indexing and scales under the CPU interpreter -----------------------------

_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch, triton, triton.language as tl
    from moelab.quant import mxfp8, mxfp8_triton

    @triton.jit
    def to_e4m3(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        y = tl.load(y_ptr + i, mask=i < n)
        tl.store(out_ptr + i, y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=i < n)

    gen = torch.Generator().manual_seed(3)
    e = torch.randint(-30, 30, (37, 10, 1), generator=gen).repeat_interleave(32, 1).squeeze(-1)
    x32 = (torch.randn(37, 320, generator=gen) * torch.pow(2.0, e)).to(torch.bfloat16).float()
    x32[0, :32] = 0; x32[1, 5] = float("nan"); x32[2, 40] = float("inf"); x32[3, :32] = 2.0 ** -120
    x32[4, :32] = 2.0 ** -130  # subnormal: float32 only, the interpreter flushes bf16 subnormals on load
    packed = torch.zeros(37, 336, dtype=torch.uint8)
    for x, rounding in ((x32, "rceil"), (x32, "floor"), (x32[:4].to(torch.bfloat16), "rceil")):
        rows = x.shape[0]
        packed.zero_()
        out = (packed[:rows, :320], packed[:rows, 320:330])
        mxfp8_triton.quantize(x, rounding, out=out, block_rows=4, block_cols=128)
        ref_data, ref_scales = mxfp8.quantize_mxfp8_torch(x, rounding)
        assert torch.equal(packed[:rows, 320:330], ref_scales), "scales differ"
        assert not packed[:, 330:].any() and not packed[rows:].any(), "wrote outside the outputs"
        # the interpreter's own E4M3 conversion is not the hardware's (it drops the carry into the exponent),
        # so the expected bytes are torch's scaled values converted by the interpreter
        y = (x.float().view(rows, 10, 32) * mxfp8.reciprocal_scale(ref_scales.int()).unsqueeze(-1)).clamp(-448, 448)
        expected = torch.empty(rows * 320, dtype=torch.uint8)
        to_e4m3[(triton.cdiv(rows * 320, 1024),)](y.reshape(-1).contiguous(), expected, rows * 320, BLOCK=1024)
        expected = torch.where(ref_scales.view(rows, 10, 1) == 255, 0x7F, expected.view(rows, 10, 32))
        assert torch.equal(packed[:rows, :320], expected.view(rows, 320).to(torch.uint8)), "data differ"
        out = mxfp8_triton.dequantize(ref_data, ref_scales, torch.float32, block_rows=2, block_cols=64)
        ref = mxfp8.dequantize_mxfp8_torch(ref_data, ref_scales, torch.float32)
        assert torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0)), "dequantize differs"
    print("ok")
    """
)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernels_under_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRET_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_triton_equals_torch_on_gpu(rounding: str) -> None:
    reason = mxfp8.triton_unavailable_reason(torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)
    x = blocks_led_by(all_bf16_values()).cuda()
    data, scales = quantize_mxfp8(x, rounding, "triton")
    ref_data, ref_scales = quantize_mxfp8(x, rounding, "torch")
    assert torch.equal(scales, ref_scales) and torch.equal(data, ref_data)
    assert torch.equal(scales.cpu(), reference_quantize_mxfp8(x.cpu(), rounding)[1])
    out = dequantize_mxfp8(data, scales, torch.float32, "triton")
    ref = dequantize_mxfp8(data, scales, torch.float32, "torch")
    assert torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0))
