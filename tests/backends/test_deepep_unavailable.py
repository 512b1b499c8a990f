"""DeepEP-family backends on a host without deep_ep (or without a GPU): one-line reasons, no import errors;
and the pure helpers they share (fp8 cast, input cache, the libraries' bandwidth figures, layout adapters)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from moelab.backends import deepep_common as common
from moelab.backends import registry
from moelab.backends.deepep import DeepEPKnobs
from moelab.backends.deepep_ll import DeepEPLowLatencyBackend, slot_sources, unit_weights
from moelab.backends.hybrid_ep import HybridEPBackend
from moelab.backends.hybrid_ep_paths import HybridSettings, local_topk
from moelab.backends.input_cache import InputCache
from moelab.core.errors import SpecError
from tests.deepep_byte_counts import deepep_nvl_figure, deepep_rdma_pairs

NAMES = ("deepep", "deepep-ll", "hybrid-ep")


@pytest.mark.parametrize("name", NAMES)
def test_registered_and_unavailable_with_one_line_reason(name: str) -> None:
    assert name in registry.entries()
    reason = registry.availability(name)
    if common.find_spec_origin("deep_ep") is None:
        assert reason is not None and "deep_ep not installed" in reason and "\n" not in reason
    elif not torch.cuda.is_available():
        assert reason is not None and "\n" not in reason


@pytest.fixture
def fake_v1_deep_ep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "deep_ep"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("class Buffer:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deep_ep", raising=False)
    return pkg


def test_hybrid_ep_says_when_deep_ep_is_not_the_hybrid_branch(fake_v1_deep_ep: Path) -> None:
    if common.find_spec_origin("hybrid_ep_cpp") is not None:
        pytest.skip("a real hybrid_ep_cpp is installed here")
    reason = HybridEPBackend.availability()
    assert reason is not None and "HybridEPBuffer" in reason and "hybrid-ep" in reason


def test_fake_deep_ep_without_gpu_says_no_cuda(fake_v1_deep_ep: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("GPU present")
    assert "no CUDA GPU" in (registry.availability("deepep") or "")


def test_low_latency_defaults_are_its_tests() -> None:
    assert DeepEPLowLatencyBackend.default_workload == {"tokens_per_rank": 128, "hidden": 7168, "topk": 8}


def test_libstdcxx_diagnosis() -> None:
    no_cxx = "\tlinux-vdso.so.1\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6\n"
    with_cxx = no_cxx + "\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6\n"
    warning = common.libstdcxx_diagnosis(
        "/x/hybrid_ep_cpp.cpython-312-x86_64-linux-gnu.so", run=lambda cmd: no_cxx
    )
    assert warning is not None and "libstdc++" in warning and "/usr/bin/g++" in warning
    assert common.libstdcxx_diagnosis("/x/hybrid_ep_cpp.so", run=lambda cmd: with_cxx) is None
    assert common.libstdcxx_diagnosis("/x/hybrid_ep_cpp.py", run=lambda cmd: no_cxx) is None


def test_per_token_cast_to_fp8_round_trips_within_fp8_error() -> None:
    x = torch.randn(16, 256, dtype=torch.bfloat16)
    x_fp8, scales = common.per_token_cast_to_fp8(x)
    assert x_fp8.dtype == torch.float8_e4m3fn and scales.shape == (16, 2) and scales.dtype == torch.float32
    back = (x_fp8.float().view(16, 2, 128) * scales.unsqueeze(-1)).view(16, 256)
    assert (back - x.float()).norm() / x.float().norm() < 0.05
    assert torch.allclose(scales, x.float().view(16, 2, 128).abs().amax(-1) / 448.0)


def test_input_cache_reuses_until_the_tensor_changes() -> None:
    cache = InputCache()
    a = torch.ones(4)
    calls: list[int] = []

    def make() -> int:
        calls.append(1)
        return len(calls)

    assert cache.get([a], make) == 1 and cache.get([a], make) == 1
    a.add_(1)  # in place: _version changes
    assert cache.get([a], make) == 2
    assert cache.get([torch.ones(4)], make) == 3  # another tensor
    assert cache.misses == 3


def test_library_figures() -> None:
    # DeepEP: rows received x hidden x 2, fp8 x (1 + 4/128)/2, over the time
    fig = deepep_nvl_figure(recv_rows=6000, hidden=7168, dtype="bf16", time_us=259.0)
    assert fig.gbps == pytest.approx(6000 * 7168 * 2 / 1e9 / 259e-6)
    fp8 = deepep_nvl_figure(recv_rows=6000, hidden=7168, dtype="fp8", time_us=259.0)
    assert fp8.bytes == pytest.approx(6000 * (7168 + 7168 / 128 * 4))
    # Hybrid-EP: rank 0's bytes over the mean of the ranks' times
    h = common.hybrid_ep_figure(100e6, [200.0, 300.0])
    assert h.time_us == 250.0 and h.gbps == pytest.approx(100e6 / 1e9 / 250e-6)
    with pytest.raises(ValueError):
        common.hybrid_ep_figure(1.0, [])
    assert common.deepep_bench_time_us([100.0, 2.0, 4.0]) == 3.0


def test_rdma_pairs_counts_own_node() -> None:
    in_rank = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert deepep_rdma_pairs(in_rank, gpus_per_node=2) == 3  # token 0: node 0; token 1: nodes 0 and 1


def test_settings_parse_and_reject() -> None:
    assert DeepEPKnobs.parse({"nvl_chunk": 8}).nvl_chunk == 8
    with pytest.raises(SpecError, match="unknown knob"):
        DeepEPKnobs.parse({"chunk": 1})
    with pytest.raises(SpecError, match="positive"):
        DeepEPKnobs.parse({"nvl_chunk": 0})
    assert HybridSettings.from_knobs({"fused": True}).path == "fused"
    assert HybridSettings.from_knobs({"permute": True}).path == "permute"
    with pytest.raises(SpecError, match="true or false"):
        HybridSettings.from_knobs({"fused": "yes"})


def test_local_topk_pads_and_compacts() -> None:
    m = torch.tensor([[True, False, True], [False, False, False]])
    w = torch.tensor([[0.5, 9.0, 0.25], [1.0, 1.0, 1.0]])
    ids, weights = local_topk(m, w, topk=4)
    assert ids.tolist() == [[0, -1, 2, -1], [-1, -1, -1, -1]]
    assert weights.tolist() == [[0.5, 0.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]]
    ids2, w2 = local_topk(m, w, topk=2)
    assert ids2.tolist() == [[0, 2], [-1, -1]] and w2.tolist() == [[0.5, 0.25], [0.0, 0.0]]


def test_unit_weights_one_per_destination_rank() -> None:
    topk_idx = torch.tensor([[0, 1, 4, 5], [3, -1, 2, 6]])
    assert unit_weights(topk_idx, experts_per_rank=2).tolist() == [
        [1, 0, 1, 0],
        [1, 0, 0, 1],
    ]  # 2 shares rank 1 with 3


def test_slot_sources_from_layout_range() -> None:
    # one expert, 2 ranks, 4 slots: rank 1's block is first (slots 0-1), rank 0's is slot 2
    layout = torch.tensor([[(2 << 32) | 1, (0 << 32) | 2]], dtype=torch.int64)
    src_rank, valid = slot_sources(layout, torch.zeros(1, 4, dtype=torch.int32), 4)
    assert valid.tolist() == [[True, True, True, False]]
    assert src_rank[valid].tolist() == [1, 1, 0]
