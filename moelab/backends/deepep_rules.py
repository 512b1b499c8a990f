"""Host-side rules for configurations DeepEP and Hybrid-EP cannot run, checked before any kernel launches.

A device-side assert (DeepEP's `EP_DEVICE_ASSERT` is a `trap`) kills the process and wedges its peers, so
these limits are mirrored here from the library sources and a case that breaks one is recorded as
`unsupported` with the reason. Every constant cites the file and line it comes from (DeepEP tag v1.2.1,
commit 9af0e0d; Hybrid-EP branch hybrid-ep, commit 94a9f8f). Pure Python: no torch, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

# DeepEP v1.2.1 csrc/kernels/intranode.cu:481 `constexpr int kNumTMABytesPerWarp = 8192;` (dispatch)
V1_INTRANODE_DISPATCH_TMA_BYTES_PER_WARP = 8192
# DeepEP v1.2.1 csrc/kernels/internode.cu:1009 `constexpr int kNumTMABytesPerWarp = 16384;` (dispatch)
V1_INTERNODE_DISPATCH_TMA_BYTES_PER_WARP = 16384
# DeepEP v1.2.1 csrc/kernels/internode.cu:1831 `kNumTMABytesPerSenderWarp = 16384` (combine, NVL senders)
V1_INTERNODE_COMBINE_TMA_BYTES_PER_WARP = 16384
# internode.cu:17-18 `struct SourceMeta { int src_rdma_rank, is_token_in_nvl_rank_bits; }`
V1_SOURCE_META_BYTES = 8
MBARRIER_BYTES = 8  # sizeof(uint64_t): the mbarrier placed right after the staged token
INT4_BYTES = 16
# DeepEP v1.2.1 csrc/kernels/launch.cuh:87-97 SWITCH_HIDDEN: the hidden sizes the low-latency kernels are built for
V1_LL_HIDDEN_SIZES = (2048, 2560, 4096, 5120, 6144, 7168, 8192)
# DeepEP v1.2.1 csrc/kernels/internode_ll.cu:350 and :931 `kNumMaxTopK = 11` (dispatch and combine)
V1_LL_MAX_TOPK = 11
# DeepEP v1.2.1 csrc/kernels/intranode.cu:187 `EP_DEVICE_ASSERT(num_topk <= 32)`
V1_MAX_TOPK = 32
# DeepEP v1.2.1 csrc/kernels/configs.cuh:3 `NUM_MAX_NVL_PEERS 8`, :6 `NUM_MAX_LOCAL_EXPERTS 1024`
V1_NUM_MAX_NVL_PEERS = 8
V1_NUM_MAX_LOCAL_EXPERTS = 1024
# DeepEP v1.2.1 deep_ep/buffer.py get_dispatch_config / get_combine_config: the rank counts with a recommended config
V1_CONFIG_RANKS = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)
# Hybrid-EP csrc/hybrid_ep/config.cuh:18-20: multi-node token capacity from the IB QP depth
HYBRID_IB_QP_MAX_TX_DEPTH = 65536
HYBRID_TX_DEPTH_TOKEN_FACTOR = 3
HYBRID_TX_DEPTH_EXTRA = 1

ELEM_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """What the rules need to know about one case on one job."""

    hidden: int
    topk: int
    tokens_per_rank: int
    experts_per_rank: int
    dtype: str  # dispatch payload: "bf16" or "fp8"
    world: int
    gpus_per_node: int
    sms: int | None = None
    sm90_features: bool = (
        True  # Buffer.is_sm90_compiled(): TMA paths compiled in (DISABLE_SM90_FEATURES unset)
    )

    @property
    def num_nodes(self) -> int:
        return -(-self.world // self.gpus_per_node)

    @property
    def num_scales(self) -> int:
        return self.hidden // 128 if self.dtype == "fp8" else 0


def _common_v1(s: Shape) -> str | None:
    if s.dtype not in ELEM_BYTES:
        return f"DeepEP dispatches bf16 or fp8 (per-128 scales), not {s.dtype}"
    if (s.hidden * ELEM_BYTES[s.dtype]) % INT4_BYTES:
        # deep_ep.cpp:336 `EP_HOST_ASSERT((x.size(1) * x.element_size()) % sizeof(int4) == 0)`
        return f"DeepEP needs hidden x element size divisible by 16 bytes, got hidden {s.hidden} ({s.dtype})"
    if s.dtype == "fp8":
        if s.hidden % 128:
            return f"DeepEP fp8 dispatch needs hidden divisible by 128 (per-128 scales), got {s.hidden}"
        if not s.sm90_features:
            return "this deep_ep build has no SM90 features (DISABLE_SM90_FEATURES): no fp8 dispatch"
    if s.topk > V1_MAX_TOPK:
        return f"DeepEP normal kernels support topk <= {V1_MAX_TOPK} (intranode.cu:187), got {s.topk}"
    if s.experts_per_rank > V1_NUM_MAX_LOCAL_EXPERTS:
        return f"DeepEP supports <= {V1_NUM_MAX_LOCAL_EXPERTS} experts per rank (configs.cuh:6), got {s.experts_per_rank}"
    if s.sms is not None and (s.sms < 2 or s.sms % 2):
        # buffer.py set_num_sms: `assert new_num_sms % 2 == 0`; deep_ep.cpp:315 one channel = two SMs
        return f"DeepEP needs an even SM count >= 2 (one channel = a send and a receive SM), got {s.sms}"
    return None


def intranode_dispatch_max_hidden(dtype: str) -> int:
    """Largest hidden the V1 intranode dispatch kernel accepts for `dtype` (with SM90 TMA compiled in).

    intranode.cu:226-235: half_hidden_int4 = hidden_int4 / 2, half_hidden_bytes = half_hidden_int4 * 16,
    `EP_DEVICE_ASSERT(hidden_int4 % 2 == 0 and half_hidden_bytes + sizeof(uint64_t) <= kNumTMABytesPerWarp)`.
    """
    elem = ELEM_BYTES[dtype]
    step = 2 * INT4_BYTES // elem  # hidden_int4 must be even: hidden is a multiple of 32 bytes
    limit_bytes = 2 * (V1_INTRANODE_DISPATCH_TMA_BYTES_PER_WARP - MBARRIER_BYTES)
    return (limit_bytes // elem) // step * step


def _intranode(s: Shape) -> str | None:
    if not s.sm90_features:
        return None  # no TMA staging without SM90 features: the limit below is not compiled in
    elem = ELEM_BYTES[s.dtype]
    hidden_int4 = s.hidden * elem // INT4_BYTES
    half_hidden_bytes = (hidden_int4 // 2) * INT4_BYTES
    if hidden_int4 % 2 or half_hidden_bytes + MBARRIER_BYTES > V1_INTRANODE_DISPATCH_TMA_BYTES_PER_WARP:
        return (
            f"DeepEP V1 intranode dispatch traps at hidden {s.hidden} {s.dtype}: half a token ({half_hidden_bytes} B) + "
            f"8 B mbarrier must fit the {V1_INTRANODE_DISPATCH_TMA_BYTES_PER_WARP} B TMA buffer per warp and hidden_int4 be even "
            f"(csrc/kernels/intranode.cu:235; {s.dtype} max hidden {intranode_dispatch_max_hidden(s.dtype)}; DeepEP#722)"
        )
    return None


def internode_token_bytes(hidden: int, dtype: str, num_topk: int, with_topk: bool = True) -> int:
    """internode.cu:45-47 get_num_bytes_per_token: align16(hidden bytes + SourceMeta + scales + topk idx (int) + weights)."""
    elem = ELEM_BYTES[dtype]
    num_scales = hidden // 128 if dtype == "fp8" else 0
    k = num_topk if with_topk else 0
    raw = hidden * elem + V1_SOURCE_META_BYTES + num_scales * 4 + k * 4 + k * 4
    return -(-raw // INT4_BYTES) * INT4_BYTES


def _internode(s: Shape) -> str | None:
    if s.num_nodes > 1 and s.gpus_per_node != V1_NUM_MAX_NVL_PEERS:
        return f"DeepEP V1 internode kernels need {V1_NUM_MAX_NVL_PEERS} GPUs per node (configs.cuh:3), got {s.gpus_per_node}"
    dispatch_bytes = internode_token_bytes(s.hidden, s.dtype, s.topk)
    if dispatch_bytes + MBARRIER_BYTES > V1_INTERNODE_DISPATCH_TMA_BYTES_PER_WARP:
        return (
            f"DeepEP V1 internode dispatch traps at hidden {s.hidden} {s.dtype} topk {s.topk}: a token's {dispatch_bytes} B + 8 B "
            f"mbarrier exceed the {V1_INTERNODE_DISPATCH_TMA_BYTES_PER_WARP} B TMA buffer (csrc/kernels/internode.cu:453)"
        )
    # combine sends bf16 rows with SourceMeta and topk weights only: internode.cu:1397 get_num_bytes_per_token(hidden_int4, 0, 0, num_topk)
    raw = s.hidden * 2 + V1_SOURCE_META_BYTES + s.topk * 4
    combine_bytes = -(-raw // INT4_BYTES) * INT4_BYTES
    if combine_bytes + MBARRIER_BYTES > V1_INTERNODE_COMBINE_TMA_BYTES_PER_WARP:
        return (
            f"DeepEP V1 internode combine traps at hidden {s.hidden} topk {s.topk}: a token's {combine_bytes} B + 8 B mbarrier "
            f"exceed the {V1_INTERNODE_COMBINE_TMA_BYTES_PER_WARP} B TMA buffer (csrc/kernels/internode.cu:1448)"
        )
    return None


def v1_normal_reason(s: Shape) -> str | None:
    """Why DeepEP V1's normal (high-throughput) kernels cannot run `s`, or None."""
    reason = _common_v1(s)
    if reason:
        return reason
    if s.world not in V1_CONFIG_RANKS:
        return f"DeepEP V1 has recommended configs for {', '.join(map(str, V1_CONFIG_RANKS))} ranks, not {s.world} (buffer.py get_dispatch_config)"
    return _intranode(s) if s.num_nodes == 1 else _internode(s)


def v1_low_latency_reason(s: Shape) -> str | None:
    """Why DeepEP V1's low-latency kernels cannot run `s`, or None."""
    if s.dtype not in ELEM_BYTES:
        return f"DeepEP low-latency dispatches bf16 or fp8, not {s.dtype}"
    if s.hidden not in V1_LL_HIDDEN_SIZES:
        return f"DeepEP low-latency kernels are built for hidden {', '.join(map(str, V1_LL_HIDDEN_SIZES))} only (csrc/kernels/launch.cuh:87), got {s.hidden}"
    if s.topk > V1_LL_MAX_TOPK:
        return (
            f"DeepEP low-latency kernels support topk <= {V1_LL_MAX_TOPK} (internode_ll.cu:350), got {s.topk}"
        )
    if s.sms is not None:
        return "DeepEP low-latency kernels choose their own SM count (one warp group per expert); run sms = default"
    return None


def hybrid_max_tokens_multinode() -> int:
    """config.cuh:35-37: the largest max_num_of_tokens_per_rank Hybrid-EP accepts across nodes."""
    return int((HYBRID_IB_QP_MAX_TX_DEPTH - 1 - HYBRID_TX_DEPTH_EXTRA) // HYBRID_TX_DEPTH_TOKEN_FACTOR)


def hybrid_ep_reason(s: Shape, *, fused: bool = False) -> str | None:
    """Why Hybrid-EP cannot run `s`, or None (config.cuh BufferConfig::is_valid / HybridEpConfigInstance::is_valid)."""
    if s.dtype not in ELEM_BYTES:
        return f"Hybrid-EP dispatches bf16 or fp8 (per-128 scales), not {s.dtype}"
    if s.dtype == "fp8" and s.hidden % 512:
        return f"Hybrid-EP fp8 needs hidden divisible by 512 (config.cuh:87, TMA of the scaling factors), got {s.hidden}"
    if s.hidden % 16:
        return f"Hybrid-EP needs hidden divisible by 16 (config.cuh:89), got {s.hidden}"
    ranks_per_node = min(s.world, s.gpus_per_node)
    if (s.experts_per_rank * ranks_per_node) % 4:
        return (
            f"Hybrid-EP needs experts per rank x ranks per node divisible by 4 (config.cuh:91), "
            f"got {s.experts_per_rank} x {ranks_per_node}"
        )
    if s.num_nodes > 1 and s.tokens_per_rank > hybrid_max_tokens_multinode():
        return f"Hybrid-EP across nodes supports <= {hybrid_max_tokens_multinode()} tokens per rank (config.cuh:35), got {s.tokens_per_rank}"
    if s.sms is not None and s.sms < 1:
        return f"SM count must be >= 1, got {s.sms}"
    return None
