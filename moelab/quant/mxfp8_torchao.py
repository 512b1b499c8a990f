"""torchao's MXFP8 dim0 (1x32, row-wise) Triton quantizer, where torchao is installed and the GPU is SM100+.

torchao's mxfp8 Triton kernels are built only when `is_sm_at_least_100()` holds (torchao 0.17 raises
"needs torch version 2.8+ and triton" on Hopper), so on H100/H200 this reports itself unavailable and
moelab's own kernel (`mxfp8_triton`) runs instead. Imported lazily: importing torchao is slow.
"""

from __future__ import annotations

import importlib.util

import torch


def unavailable_reason(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """None when torchao's kernel can quantize a `dtype` tensor on `device`, else why not."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed"
    if device.type != "cuda":
        return f"torchao's MXFP8 kernels need a CUDA tensor, got one on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 10:
        return f"torchao's MXFP8 Triton kernels need SM100+, this GPU is SM{major}{minor}"
    if dtype != torch.bfloat16:
        return f"torchao's triton_to_mxfp8_dim0 takes bf16 input only, got {dtype}"
    try:
        from torchao.prototype.mx_formats import kernels
    except Exception as exc:  # a broken torchao install must not break moelab
        return f"cannot import torchao.prototype.mx_formats.kernels: {type(exc).__name__}: {exc}"
    if not getattr(kernels, "_triton_kernels_available", False):
        return "torchao reports its MXFP8 Triton kernels unavailable on this host"
    return None


def version() -> str | None:
    if importlib.util.find_spec("torchao") is None:
        return None
    import torchao

    return str(getattr(torchao, "__version__", "unknown"))


def quantize(x: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 data as uint8, E8M0 scales as uint8) from torchao.triton_to_mxfp8_dim0."""
    from torchao.prototype.mx_formats.kernels import triton_to_mxfp8_dim0

    data, scales = triton_to_mxfp8_dim0(x.contiguous(), inner_block_size=32, scaling_mode=rounding)
    data_u8 = data.view(torch.uint8)
    scales_u8 = scales.view(torch.uint8)
    # NaN blocks: torchao writes its hardware NaN byte; moelab's canonical byte is 0x7F (same meaning)
    nan_block = (scales_u8 == 0xFF).unsqueeze(-1)
    blocks = data_u8.reshape(*data_u8.shape[:-1], data_u8.shape[-1] // 32, 32)
    blocks = torch.where(nan_block, torch.full_like(blocks, 0x7F), blocks)
    return blocks.reshape(data_u8.shape), scales_u8
