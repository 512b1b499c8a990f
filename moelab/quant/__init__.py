"""Payload quantizers for the quantized all-to-all backends (MXFP8 today)."""

from moelab.quant.mxfp8 import (
    BLOCK,
    IMPLS,
    ROUNDINGS,
    dequantize_mxfp8,
    packed_row_bytes,
    quantize_mxfp8,
    reference_dequantize_mxfp8,
    reference_quantize_mxfp8,
    resolve_impl,
)

__all__ = [
    "BLOCK",
    "IMPLS",
    "ROUNDINGS",
    "dequantize_mxfp8",
    "packed_row_bytes",
    "quantize_mxfp8",
    "reference_dequantize_mxfp8",
    "reference_quantize_mxfp8",
    "resolve_impl",
]
