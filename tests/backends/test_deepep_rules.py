"""The host-side unsupported-config rules, against the constants and conditions of the library sources."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moelab.backends import deepep_rules as r


def shape(**kw: object) -> r.Shape:
    base: dict[str, object] = {
        "hidden": 7168,
        "topk": 8,
        "tokens_per_rank": 4096,
        "experts_per_rank": 8,
        "dtype": "bf16",
        "world": 2,
        "gpus_per_node": 2,
    }
    base.update(kw)
    return r.Shape(**base)  # type: ignore[arg-type]


def test_intranode_bf16_8192_traps_and_fp8_fits() -> None:
    reason = r.v1_normal_reason(shape(hidden=8192))
    assert reason is not None and "intranode.cu:235" in reason and "8192" in reason
    assert r.v1_normal_reason(shape(hidden=8192, dtype="fp8")) is None
    assert r.v1_normal_reason(shape(hidden=7168)) is None


def test_intranode_limits_are_the_kernel_condition() -> None:
    assert r.intranode_dispatch_max_hidden("bf16") == 8176
    assert r.v1_normal_reason(shape(hidden=8176)) is None
    assert r.v1_normal_reason(shape(hidden=8184)) is not None  # fits the bytes, but hidden_int4 = 1023 is odd
    assert r.intranode_dispatch_max_hidden("fp8") == 16352
    assert r.v1_normal_reason(shape(hidden=16384, dtype="fp8")) is not None


@given(st.integers(min_value=1, max_value=1200).map(lambda k: k * 16))
def test_intranode_rule_matches_kernel_assert(hidden: int) -> None:
    hidden_int4 = hidden * 2 // 16
    ok = hidden_int4 % 2 == 0 and (hidden_int4 // 2) * 16 + 8 <= 8192
    assert (r.v1_normal_reason(shape(hidden=hidden)) is None) == ok


def test_no_sm90_features_lifts_the_tma_limit_but_not_fp8() -> None:
    assert r.v1_normal_reason(shape(hidden=8192, sm90_features=False)) is None
    assert "SM90" in (r.v1_normal_reason(shape(dtype="fp8", sm90_features=False)) or "")


def test_internode_caps() -> None:
    def internode(hidden: int, dtype: str = "bf16") -> str | None:
        return r.v1_normal_reason(shape(hidden=hidden, dtype=dtype, world=16, gpus_per_node=8))

    assert internode(8144) is None
    assert "internode.cu:453" in (
        internode(8152) or ""
    )  # dispatch: 2H + SourceMeta + 8 idx + 8 weights, aligned to 16
    assert r.internode_token_bytes(8144, "bf16", 8) == 16368
    # fp8 dispatch fits internode at 8192, but combine moves bf16 rows and traps there (internode.cu:1448)
    assert r.internode_token_bytes(8192, "fp8", 8) + 8 <= 16384
    assert "combine" in (internode(8192, "fp8") or "")
    assert internode(8064, "fp8") is None
    assert "8 GPUs per node" in (r.v1_normal_reason(shape(world=8, gpus_per_node=4)) or "")


def test_internode_combine_cap_with_few_topk() -> None:
    # topk 1: dispatch needs align16(2H + 16) + 8 <= 16384 and combine align16(2H + 12) + 8 <= 16384
    assert r.v1_normal_reason(shape(hidden=8176, topk=1, world=16, gpus_per_node=8)) is None
    assert r.v1_normal_reason(shape(hidden=8184, topk=1, world=16, gpus_per_node=8)) is not None


def test_common_v1_rules() -> None:
    assert "even SM count" in (r.v1_normal_reason(shape(sms=7)) or "")
    assert r.v1_normal_reason(shape(sms=24)) is None
    assert "recommended configs" in (r.v1_normal_reason(shape(world=3, gpus_per_node=3)) or "")
    assert "topk" in (r.v1_normal_reason(shape(topk=33)) or "")
    assert "mxfp8" in (r.v1_normal_reason(shape(dtype="mxfp8")) or "")
    assert "128" in (r.v1_normal_reason(shape(hidden=7184, dtype="fp8")) or "")


@pytest.mark.parametrize("hidden", r.V1_LL_HIDDEN_SIZES)
def test_low_latency_supported_hiddens(hidden: int) -> None:
    assert r.v1_low_latency_reason(shape(hidden=hidden, tokens_per_rank=128)) is None


def test_low_latency_rules() -> None:
    assert "launch.cuh:87" in (r.v1_low_latency_reason(shape(hidden=7680)) or "")
    assert r.v1_low_latency_reason(shape(topk=11)) is None
    assert "topk <= 11" in (r.v1_low_latency_reason(shape(topk=12)) or "")
    assert "SM count" in (r.v1_low_latency_reason(shape(sms=24)) or "")


def test_hybrid_ep_rules() -> None:
    assert r.hybrid_ep_reason(shape(hidden=8192)) is None
    assert r.hybrid_ep_reason(shape(hidden=8192, dtype="fp8")) is None
    assert "512" in (r.hybrid_ep_reason(shape(hidden=7168 + 256, dtype="fp8")) or "")
    assert "16" in (r.hybrid_ep_reason(shape(hidden=7176)) or "")
    assert "divisible by 4" in (r.hybrid_ep_reason(shape(experts_per_rank=1)) or "")
    assert r.hybrid_ep_reason(shape(experts_per_rank=2)) is None
    assert r.hybrid_max_tokens_multinode() == 21844
    assert "21844" in (r.hybrid_ep_reason(shape(tokens_per_rank=30000, world=16, gpus_per_node=8)) or "")
    assert r.hybrid_ep_reason(shape(tokens_per_rank=30000)) is None
