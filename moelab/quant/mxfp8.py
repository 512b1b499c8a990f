"""MXFP8 (OCP MX v1.0): blocks of 32 consecutive elements along the last dimension, E4M3 elements, one
E8M0 scale per block. One function, three implementations that agree bit for bit: torchao's kernels (SM100+),
moelab's fused Triton kernel (Hopper and Ada, `mxfp8_triton`), and plain torch ops (any device).

Scale rounding (the E8M0 byte, biased by 127, of the block scale s = 2^(byte - 127)); for amax = m * 2^E
(m in [1, 2)) every rule is E - 8 plus one where m passes a threshold, computed from the bits of the
float32 amax (ROUND_UP_ABOVE), so no float division or subnormal arithmetic is involved:
- ``rceil`` (default, torchao's RCEIL / cuBLAS's rule): the smallest s with amax / s <= 448, i.e.
  ceil(log2(amax / 448)): plus one where m > 1.75. torchao computes float32(amax * float32(1/448)) and
  rounds its exponent up; the two agree for every bf16 and fp16 value (tests check all of them) and for
  every float32 amax but one: 448 * 2^-127 plus one ulp, whose product torchao rounds down to the
  subnormal 2^-127 (byte 0) where the spec gives byte 1.
- ``floor`` (the OCP rule): floor(log2(amax)) - 8, 8 being the exponent of 448; elements of a block whose
  amax has a mantissa above 1.75 exceed 448 after scaling and saturate to +-448 (up to 12.5% error).
- ``ceil`` (torchao's CEIL): ceil(log2(amax)) - 8: plus one where m > 1. Nothing saturates (amax / s is at
  most 256) at the price of one bit of range for most blocks: for users who want no clipping and a
  rule that does not depend on the element format's maximum.
- ``even`` (torchao's EVEN): amax rounded to E4M3's 3 mantissa bits (half away from zero), then floor:
  plus one where m >= 1.9375. Between floor and rceil: saturates for m in [1.75, 1.9375).
The byte is clamped to [0, 254]; a block containing NaN or +-inf gets 0xFF (E8M0 NaN).

Elements: x * 2^(127 - byte) in float32 (exact: a power-of-two product), clamped to +-448, then rounded to
nearest-even E4M3 (the clamp matters for ``floor`` and ``even``, and for torch < 2.13, whose eager cast did
not saturate).

Special values, what moelab produces (the OCP spec's behaviour):
- block of zeros: byte 0 (s = 2^-127); elements keep their sign (+0 -> 0x00, -0 -> 0x80); dequantizes to +-0.
- subnormal inputs (bf16/fp32 subnormals): amax below 448 * 2^-127 gives byte 0, elements are x * 2^127
  rounded to E4M3: a block of subnormals comes back to within E4M3 precision (bf16 subnormals exactly
  when they have at most 4 significant bits, e.g. the powers of two). Elements below 2^-10 * s within a
  larger block round to +-0, as any element does that is less than 2^-10 of the block scale.
- +-448 * 2^k: byte 127 + k, element exactly +-448 (0x7E / 0xFE); round trip exact.
- values so close to the float32 maximum that E4M3 rounding carries them to 2^128 (|x| >= 0xF * 2^123,
  e.g. bf16 3.39e38): byte 247 and element 256; they dequantize to +-inf, as they do in torchao.
- +-inf or NaN anywhere in a block: byte 0xFF and every element of that block 0x7F (E4M3 NaN, positive, so
  the bits do not depend on which NaN the hardware produced); dequantizes to NaN for the whole block.
  Other blocks of the row are unaffected.

Where torchao 0.18's `to_mx` (the eager reference of its kernels) differs, and why moelab keeps the spec
(tests/test_mxfp8_torchao.py checks each difference against torchao on the CPU):
- scale byte 0 (amax below 448 * 2^-127 for rceil, below 2^-119 for the others): the spec's scale is the
  float32 subnormal 2^-127 and moelab multiplies by 2^127. torchao's floor/ceil/even clamp the scale to the
  smallest normal float, 2^-126, so their elements are half the spec's (read back by the byte they are off
  by 2x); its rceil multiplies by 1 instead, so the elements round to +-0 and the block's data is lost.
  torchao avoids subnormal scales because GPU code generation mishandled them (pytorch#125557); moelab's
  bit arithmetic never computes with a subnormal, so it can keep the spec, which is what a consumer reading
  the byte as 2^(byte - 127) (a block-scaled MMA, moelab's dequantizer) expects.
- +-inf in a block: torchao takes the block's scale from the inf's exponent (floor/ceil/even: byte 247,
  rceil: byte 254, the largest finite scales), saturates the inf elements to +-448 and rounds every other
  element to +-0: the block reads back as finite garbage (+-448 * 2^120) or +-inf plus zeros. The spec
  makes a block with a non-finite amax NaN (scale 0xFF); moelab follows it so an overflow upstream shows up
  as NaN after the all-to-all instead of as plausible numbers.
- NaN in a block: both give scale 0xFF, so the block dequantizes to NaN in both; torchao's element bytes
  vary (NaN times x, or x / inf = 0), moelab's are always 0x7F.
The stored definition `mxfp8` (table `definitions`) carries the same statement.

Dequantization: float32(E4M3) * 2^(byte - 127) (byte 0 is the float32 subnormal 2^-127, 0xFF is NaN), then
one rounding to the output dtype. Data and scales travel as uint8 (gloo refuses float8 dtypes; torchao
views them as uint8 for NCCL too); view the data as torch.float8_e4m3fn to use it as fp8.
"""

from __future__ import annotations

import math

import torch

from moelab.core.errors import BackendUnavailable, SpecError
from moelab.quant.mx_format import (
    BLOCK,
    E4M3_MAX,
    E4M3_NAN_BYTE,
    E8M0_BIAS,
    E8M0_NAN,
    ROUND_UP_ABOVE,
    ROUNDINGS,
)

TORCHAO_KERNEL_ROUNDINGS = ("rceil", "floor")  # torchao's triton_to_mxfp8_dim0 has no ceil or even
IMPLS = ("auto", "torch", "triton", "torchao")
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_rounding(rounding: str) -> None:
    if rounding not in ROUNDINGS:
        raise SpecError(f"unknown MXFP8 scale rounding {rounding!r}: choose one of {', '.join(ROUNDINGS)}")


def _check_input(x: torch.Tensor) -> None:
    if x.dtype not in INPUT_DTYPES:
        raise SpecError(f"MXFP8 quantization takes bf16, fp16 or fp32 input, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] % BLOCK != 0:
        raise SpecError(f"MXFP8 needs the last dimension divisible by {BLOCK}, got shape {tuple(x.shape)}")


# ---------------------------------------------------------------------------------------------------------
# Reference, written from the spec: float64, exponent arithmetic by frexp, E4M3 rounding by hand.
# ---------------------------------------------------------------------------------------------------------


def reference_scale_exponent(amax: torch.Tensor, rounding: str) -> torch.Tensor:
    """Unclamped unbiased scale exponent (int64) of float64 block maxima; NaN/inf maxima give 128 (-> 0xFF)."""
    check_rounding(rounding)
    amax = amax.to(torch.float64)
    finite = torch.isfinite(amax)
    safe = torch.where(finite & (amax > 0), amax, torch.ones_like(amax))
    if rounding == "rceil":
        mant, exp = torch.frexp(safe / E4M3_MAX)  # exact: amax has <= 24 significant bits, 448 = 7 * 2^6
        # r = mant * 2^exp with mant in [0.5, 1): ceil(log2 r) = exp - 1 when r is a power of two, else exp
        e = torch.where(mant == 0.5, exp - 1, exp).to(torch.int64)
    else:
        mant, exp = torch.frexp(safe)  # amax = (2 mant) * 2^(exp - 1), 2 mant in [1, 2)
        e = exp.to(torch.int64) - 1 - 8  # floor(log2 amax) - emax(E4M3)
        if rounding == "ceil":
            e = e + (mant > 0.5).to(torch.int64)
        elif rounding == "even":  # 2 mant rounded to 3 fraction bits, half away from zero, reaches 2
            e = e + (2 * mant >= 2 - 2.0**-4).to(torch.int64)
    e = torch.where(amax > 0, e, torch.full_like(e, -E8M0_BIAS))
    return torch.where(finite, e, torch.full_like(e, E8M0_BIAS + 1))


def _round_e4m3_reference(q: torch.Tensor) -> torch.Tensor:
    """float64 values within [-448, 448] -> E4M3 bytes, round to nearest even, by the format's definition."""
    mag = q.abs()
    sign = (torch.signbit(q).to(torch.int64)) << 7
    _, exp = torch.frexp(torch.where(mag > 0, mag, torch.ones_like(mag)))
    e = torch.clamp(exp.to(torch.int64) - 1, min=-6)  # exponent of the binade; subnormals share 2^-6's
    ulp = torch.pow(2.0, (e - 3).to(torch.float64))
    rounded = torch.round(mag / ulp) * ulp  # torch.round: half to even
    _, rexp = torch.frexp(torch.where(rounded > 0, rounded, torch.ones_like(rounded)))
    re = rexp.to(torch.int64) - 1
    normal = rounded >= 2.0**-6
    exp_field = torch.where(normal, re + 7, torch.zeros_like(re))
    mant_field = torch.where(
        normal,
        (rounded / torch.pow(2.0, re.to(torch.float64)) - 1.0) * 8,
        rounded / 2.0**-9,
    ).to(torch.int64)
    return (sign | (exp_field << 3) | mant_field).to(torch.uint8)


def reference_quantize_mxfp8(x: torch.Tensor, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """The spec, slowly: (E4M3 bytes, E8M0 bytes) as uint8. Any float input; computed in float64 on the CPU."""
    _check_input(x)
    x64 = x.detach().to("cpu", torch.float64)
    blocks = x64.reshape(*x64.shape[:-1], x64.shape[-1] // BLOCK, BLOCK)
    mag = blocks.abs()
    amax = mag.amax(dim=-1)
    poisoned = ~torch.isfinite(mag).all(dim=-1)  # amax alone would hide a NaN next to an inf on some paths
    amax = torch.where(poisoned, torch.full_like(amax, math.inf), amax)
    e = reference_scale_exponent(amax, rounding).clamp(-E8M0_BIAS, E8M0_BIAS + 1)
    scale_byte = torch.where(poisoned, torch.full_like(e, E8M0_NAN), e + E8M0_BIAS)
    e_safe = torch.where(poisoned, torch.zeros_like(e), e)
    q = blocks / torch.pow(2.0, e_safe.to(torch.float64)).unsqueeze(-1)
    q = torch.where(poisoned.unsqueeze(-1), torch.zeros_like(q), q).clamp(-E4M3_MAX, E4M3_MAX)
    data = _round_e4m3_reference(q)
    data = torch.where(poisoned.unsqueeze(-1), torch.full_like(data, E4M3_NAN_BYTE), data)
    return data.reshape(x.shape), scale_byte.to(torch.uint8)


def e4m3_byte_values() -> torch.Tensor:
    """float64 value of each of the 256 E4M3 bytes (NaN for 0x7F and 0xFF), from the format's definition."""
    b = torch.arange(256, dtype=torch.int64)
    sign = torch.where(b >= 128, -1.0, 1.0).to(torch.float64)
    exp_field, mant = (b >> 3) & 0xF, (b & 0x7).to(torch.float64)
    normal = (1.0 + mant / 8) * torch.pow(2.0, (exp_field - 7).to(torch.float64))
    value = sign * torch.where(exp_field > 0, normal, mant * 2.0**-9)
    return torch.where((b & 0x7F) == 0x7F, torch.full_like(value, math.nan), value)


def reference_dequantize_mxfp8(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 values of (E4M3 bytes, E8M0 bytes), by the formats' definitions."""
    values = e4m3_byte_values()[data.cpu().to(torch.int64)]
    s = scales.cpu().to(torch.int64)
    scale = torch.where(s == E8M0_NAN, math.nan, torch.pow(2.0, (s - E8M0_BIAS).to(torch.float64)))
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK) * scale.unsqueeze(-1)
    return blocks.reshape(values.shape)


# ---------------------------------------------------------------------------------------------------------
# Plain torch: any device, the bits every other implementation must match.
# ---------------------------------------------------------------------------------------------------------


def scale_bytes_from_amax(amax: torch.Tensor, rounding: str) -> torch.Tensor:
    """E8M0 bytes (int32) from float32 block maxima by exponent arithmetic on their bits."""
    bits = amax.to(torch.float32).view(torch.int32)
    ebits = torch.bitwise_right_shift(bits, 23) & 0xFF
    byte = ebits - 8 + ((bits & 0x7FFFFF) > ROUND_UP_ABOVE[rounding]).to(torch.int32)
    byte = torch.clamp(byte, min=0)
    return torch.where(ebits == 0xFF, torch.full_like(byte, E8M0_NAN), byte)


def reciprocal_scale(byte: torch.Tensor) -> torch.Tensor:
    """float32 2^(127 - byte); NaN for 0xFF. Exact for every byte the quantizer makes (0..247)."""
    rcp = torch.bitwise_left_shift((254 - byte).clamp(min=1), 23).view(torch.float32)
    return torch.where(byte == E8M0_NAN, torch.full_like(rcp, math.nan), rcp)


def scale_value(byte: torch.Tensor) -> torch.Tensor:
    """float32 2^(byte - 127): byte 0 is the subnormal 2^-127, 0xFF is NaN."""
    b = byte.to(torch.int32)
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), torch.bitwise_left_shift(b, 23))
    bits = torch.where(b == E8M0_NAN, torch.full_like(b, 0x7FC00000), bits)
    return bits.view(torch.float32)


def quantize_mxfp8_torch(x: torch.Tensor, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch ops (float32 and int32 arithmetic); runs wherever torch does."""
    _check_input(x)
    check_rounding(rounding)
    xf = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    amax = xf.abs().amax(dim=-1)  # NaN propagates; +-inf gives inf: both end as 0xFF
    byte = scale_bytes_from_amax(amax, rounding)
    y = (xf * reciprocal_scale(byte).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    data = y.to(torch.float8_e4m3fn).view(torch.uint8)
    nan_block = (byte == E8M0_NAN).unsqueeze(-1)
    data = torch.where(nan_block, torch.full_like(data, E4M3_NAN_BYTE), data)
    return data.reshape(x.shape), byte.to(torch.uint8)


def dequantize_mxfp8_torch(
    data: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    values = data.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK)
    out = blocks * scale_value(scales).unsqueeze(-1)
    return out.reshape(values.shape).to(out_dtype)


# ---------------------------------------------------------------------------------------------------------
# The one entry point.
# ---------------------------------------------------------------------------------------------------------


def triton_unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return f"the Triton quantizer needs a CUDA tensor, got one on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"the Triton quantizer needs SM89+ (FP8 conversions), this GPU is SM{major}{minor}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def impl_unavailable_reason(
    impl: str, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> str | None:
    """None when `impl` can quantize a `dtype` tensor on `device`, else why not (one line)."""
    if impl == "torch":
        return None
    if impl == "triton":
        return triton_unavailable_reason(device)
    if impl == "torchao":
        from moelab.quant import mxfp8_torchao

        return mxfp8_torchao.unavailable_reason(device, dtype)
    raise SpecError(f"unknown MXFP8 quantizer {impl!r}: choose one of {', '.join(IMPLS)}")


def resolve_impl(impl: str, device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> str:
    """The implementation `impl` names on `device`: "auto" picks torchao, then triton, then torch."""
    device = torch.device(device)
    if impl == "auto":
        for candidate in ("torchao", "triton"):
            if impl_unavailable_reason(candidate, device, dtype) is None:
                return candidate
        return "torch"
    reason = impl_unavailable_reason(impl, device, dtype)
    if reason is not None:
        raise BackendUnavailable(f"MXFP8 quantizer {impl!r} unavailable: {reason}")
    return impl


def quantize_mxfp8(
    x: torch.Tensor,
    rounding: str = "rceil",
    impl: str = "auto",
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H] (H % 32 == 0) -> (E4M3 data [..., H] uint8, E8M0 scales [..., H/32] uint8).

    `out`: optional (data, scales) uint8 tensors to write into, e.g. column slices of one packed row buffer
    (unit stride along the last dimension).
    """
    _check_input(x)
    check_rounding(rounding)
    chosen = resolve_impl(impl, x.device, x.dtype)
    if chosen == "torchao" and rounding not in TORCHAO_KERNEL_ROUNDINGS:
        if impl != "auto":
            raise BackendUnavailable(
                f"MXFP8 quantizer 'torchao' has no {rounding!r} scale rounding (only rceil, floor)"
            )
        chosen = "triton" if triton_unavailable_reason(x.device) is None else "torch"
    if chosen == "triton":
        from moelab.quant import mxfp8_triton

        return mxfp8_triton.quantize(x, rounding, out=out)
    if chosen == "torchao":
        from moelab.quant import mxfp8_torchao

        data, scales = mxfp8_torchao.quantize(x, rounding)
    else:
        data, scales = quantize_mxfp8_torch(x, rounding)
    if out is None:
        return data, scales
    out[0].copy_(data)
    out[1].copy_(scales)
    return out


def dequantize_mxfp8(
    data: torch.Tensor,
    scales: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    impl: str = "auto",
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """(E4M3 bytes [..., H], E8M0 bytes [..., H/32]) -> values [..., H] in `out_dtype` (one rounding).

    impl: "auto" uses the Triton kernel on CUDA where it runs, else torch ("torchao" means torch here:
    the result is the same bits, and torchao has no standalone dequantizer for this layout).
    """
    if data.shape[-1] != scales.shape[-1] * BLOCK or data.shape[:-1] != scales.shape[:-1]:
        raise SpecError(f"MXFP8 data {tuple(data.shape)} and scales {tuple(scales.shape)} do not match")
    use_triton = impl == "triton" or (impl == "auto" and triton_unavailable_reason(data.device) is None)
    if use_triton:
        reason = triton_unavailable_reason(data.device)
        if reason is not None:
            raise BackendUnavailable(f"MXFP8 dequantizer 'triton' unavailable: {reason}")
        from moelab.quant import mxfp8_triton

        return mxfp8_triton.dequantize(data, scales, out_dtype, out=out)
    if impl not in IMPLS:
        raise SpecError(f"unknown MXFP8 dequantizer {impl!r}: choose one of {', '.join(IMPLS)}")
    result = dequantize_mxfp8_torch(data, scales, out_dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def packed_row_bytes(hidden: int) -> int:
    """Bytes of one token packed as [E4M3 data | E8M0 scales], padded to an even count (a bf16 carrier)."""
    raw = hidden + hidden // BLOCK
    return raw + (raw % 2)
