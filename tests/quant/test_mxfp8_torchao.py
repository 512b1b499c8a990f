"""moelab's MXFP8 quantizer against torchao's `to_mx` (its eager reference, on the CPU): the same bytes on
normal data in all four scale roundings, and exactly the documented differences (moelab/quant/mxfp8.py)
on blocks whose scale byte is 0 and on blocks holding +-inf or NaN. Skipped without torchao."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.quant import mxfp8
from moelab.quant.mxfp8 import e4m3_byte_values, quantize_mxfp8_torch

mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
mx_config = pytest.importorskip("torchao.prototype.mx_formats.config")

NAN = 0xFF


def torchao_mx(x: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 bytes, E8M0 bytes) from torchao's to_mx."""
    scale, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, mx_config.ScaleCalculationMode(rounding))
    return data.view(torch.uint8), scale.view(torch.uint8).reshape(*x.shape[:-1], x.shape[-1] // 32)


def normal_blocks(rows: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random blocks at magnitudes from 2^-60 to 2^60: every scale byte far from 0 and from 0xFF."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.pow(2.0, torch.randint(-60, 60, (rows, 8, 1), generator=g).double())
    x = torch.randn(rows, 8, 32, generator=g, dtype=torch.float64) * scale
    return x.reshape(rows, 256).to(dtype)


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_normal_data_matches_torchao_byte_for_byte(rounding: str, dtype: torch.dtype) -> None:
    x = normal_blocks(512, dtype, seed=len(rounding))
    ours, theirs = quantize_mxfp8_torch(x, rounding), torchao_mx(x, rounding)
    assert torch.equal(ours[1], theirs[1]) and torch.equal(ours[0], theirs[0])


@pytest.mark.parametrize("rounding", mxfp8.ROUNDINGS)
def test_every_bf16_block_maximum_matches_torchao(rounding: str) -> None:
    """Every finite bf16 value leading a block (ramp below it), wherever the scale byte is not 0."""
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values = values[torch.isfinite(values) & (values.float().abs() >= 2.0**-110)]
    x = values.float().unsqueeze(1) * torch.linspace(1.0, -0.03, 32).unsqueeze(0)
    x = x.to(torch.bfloat16)
    ours, theirs = quantize_mxfp8_torch(x, rounding), torchao_mx(x, rounding)
    assert torch.equal(ours[1], theirs[1]) and torch.equal(ours[0], theirs[0])


@settings(max_examples=60, deadline=None)
@given(
    rounding=st.sampled_from(mxfp8.ROUNDINGS),
    exponent=st.integers(-100, 100),
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=32, max_size=32),
)
def test_any_block_of_normal_scale_matches_torchao(rounding: str, exponent: int, values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float32) * 2.0**exponent
    if x.abs().max() < 2.0**-100:  # scale byte near 0: the documented difference, tested below
        return
    ours, theirs = quantize_mxfp8_torch(x.unsqueeze(0), rounding), torchao_mx(x.unsqueeze(0), rounding)
    assert torch.equal(ours[1], theirs[1]) and torch.equal(ours[0], theirs[0])


TINY = [2.0**-130, -(2.0**-128), 3 * 2.0**-133, 0.0]  # a block whose scale byte is 0 in every rounding


def test_scale_byte_zero_blocks_differ_as_documented() -> None:
    x = torch.tensor(TINY + [0.0] * 28, dtype=torch.float32).unsqueeze(0)
    values = e4m3_byte_values()
    for rounding in mxfp8.ROUNDINGS:
        (data, scale), (ao_data, ao_scale) = quantize_mxfp8_torch(x, rounding), torchao_mx(x, rounding)
        assert scale.item() == ao_scale.item() == 0
        ours = values[data[0].long()]
        assert ours[:4].tolist() == [v * 2.0**127 for v in TINY]  # the spec: x / 2^-127
        theirs = values[ao_data[0].long()]
        if rounding == "rceil":  # torchao multiplies by 1: the block's data is lost
            assert theirs.abs().max().item() == 0.0
        else:  # torchao divides by the smallest normal, 2^-126: half the spec's elements
            assert (2 * theirs).tolist() == ours.tolist()


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_infinite_blocks_differ_as_documented(bad: float) -> None:
    x = torch.ones(2, 32, dtype=torch.float32)
    x[0, 3] = bad
    for rounding in mxfp8.ROUNDINGS:
        (data, scale), (ao_data, ao_scale) = quantize_mxfp8_torch(x, rounding), torchao_mx(x, rounding)
        assert scale[0].item() == NAN and set(data[0].tolist()) == {0x7F}  # moelab: the block is NaN
        assert ao_scale[0].item() == (254 if rounding == "rceil" else 247)  # torchao: largest finite scale
        assert ao_data[0, 3].item() == (0x7E if bad > 0 else 0xFE)  # the inf saturated to +-448 ...
        assert set(ao_data[0].tolist()) - {ao_data[0, 3].item()} == {0}  # ... and the rest of the block 0
        assert (
            torch.equal(data[1], ao_data[1]) and scale[1].item() == ao_scale[1].item()
        )  # other blocks agree


def test_nan_blocks_are_nan_in_both() -> None:
    x = torch.ones(1, 64, dtype=torch.float32)
    x[0, 7] = float("nan")
    for rounding in mxfp8.ROUNDINGS:
        (data, scale), (ao_data, ao_scale) = quantize_mxfp8_torch(x, rounding), torchao_mx(x, rounding)
        assert scale[0, 0].item() == ao_scale[0, 0].item() == NAN  # dequantizes to NaN either way
        assert set(data[0, :32].tolist()) == {0x7F}
        assert torch.equal(data[0, 32:], ao_data[0, 32:])
