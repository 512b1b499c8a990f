"""The OCP MX v1.0 constants of MXFP8 (E4M3 elements, E8M0 scales, 32-element blocks), shared by the torch
path (`mxfp8`) and the Triton kernel (`mxfp8_triton`)."""

BLOCK = 32
E4M3_MAX = 448.0
E8M0_NAN = 0xFF
E8M0_BIAS = 127
E4M3_NAN_BYTE = 0x7F
ROUNDINGS = ("rceil", "floor", "ceil", "even")
# the scale exponent is the amax's plus one where the amax's float32 mantissa bits exceed this
ROUND_UP_ABOVE = {"floor": 0x7FFFFF, "rceil": 0x600000, "ceil": 0, "even": 0x77FFFF}
