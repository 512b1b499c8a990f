"""moelab's DeepEP V2 engine against a CPU stand-in of `deep_ep.ElasticBuffer` (DeepEP main,
deep_ep/buffers/elastic.py) that keeps the library's argument rules: the automatic SM count (num_sms=0) is
computed from num_experts before the handle is read, a cached dispatch takes no topk_idx and no CPU sync,
outputs are exact with do_cpu_sync=True, and combine takes exactly the received rows."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from moelab.backends.deepep import DeepEPHandle, _V2Engine

WORLD, EXPERTS, TOPK, HIDDEN = 2, 16, 4, 8


class FakeEPHandle:
    def __init__(self, num_experts: int, num_sms: int, topk_idx: torch.Tensor, num_recv_tokens: int) -> None:
        self.num_experts = num_experts
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.num_recv_tokens = num_recv_tokens


class FakeElasticBuffer:
    """The argument checks of ElasticBuffer.dispatch/combine; the 'network' keeps this rank's own rows."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int) -> int:
        # elastic.py get_expected_topk: `assert num_experts % num_groups == 0` and math.comb(num_experts, ...)
        assert num_experts % WORLD == 0
        return max(4, math.comb(num_experts, num_topk) % 7 * 2)

    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        num_experts: int | None = None,
        num_sms: int = 0,
        handle: FakeEPHandle | None = None,
        do_cpu_sync: bool | None = None,
    ) -> tuple[Any, Any, Any, FakeEPHandle, None]:
        num_topk = (handle.topk_idx if topk_idx is None else topk_idx).shape[1]
        num_sms = self.get_theoretical_num_sms(num_experts, num_topk) if num_sms == 0 else num_sms  # type: ignore[arg-type]
        self.calls.append(("dispatch", num_sms))
        if handle is not None:
            assert topk_idx is None and not do_cpu_sync
            rows = handle.num_recv_tokens
            return x[:rows].clone(), None, None, handle, None
        assert topk_idx is not None and topk_weights is not None and num_experts is not None
        local = (topk_idx // (num_experts // WORLD) == 0).any(dim=1)
        rows = int(local.sum())
        handle = FakeEPHandle(num_experts, num_sms, topk_idx.clone(), rows)
        return x[local].clone(), topk_idx[local].clone(), topk_weights[local].clone(), handle, None

    def combine(
        self, x: torch.Tensor, handle: FakeEPHandle, num_sms: int = 0
    ) -> tuple[torch.Tensor, None, None]:
        assert x.shape[0] == handle.num_recv_tokens, "src_metadata rows must equal x rows"
        self.calls.append(("combine", handle.num_sms if num_sms == 0 else num_sms))
        out = torch.zeros(handle.topk_idx.shape[0], x.shape[1], dtype=x.dtype)
        return out, None, None


def _engine(sms: int | None) -> tuple[_V2Engine, FakeElasticBuffer]:
    buf = FakeElasticBuffer()
    backend: Any = SimpleNamespace(_make_v2=lambda cases: buf)
    engine = _V2Engine(backend, [])
    case: Any = SimpleNamespace(sms=sms)
    engine.prepare(case)
    return engine, buf


def _routing(tokens: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    idx = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOPK] for _ in range(tokens)])
    x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16)
    return x, idx, torch.rand(tokens, TOPK, generator=gen)


@pytest.mark.parametrize("sms", [None, 24])
def test_cached_dispatch_and_combine_run_on_the_fresh_dispatch_sms(sms: int | None) -> None:
    engine, buf = _engine(sms)
    x, idx, w = _routing()
    fresh = engine.dispatch(x, idx, w, None, EXPERTS)
    assert isinstance(fresh.handle, DeepEPHandle)
    cached = engine.dispatch(x, idx, w, fresh.handle, EXPERTS)
    assert torch.equal(cached.recv_topk_idx, fresh.recv_topk_idx) and cached.num_rows == fresh.num_rows
    engine.combine(cached.recv_x, cached.handle)
    used = {n for _, n in buf.calls}
    assert len(used) == 1, buf.calls  # one SM count for fresh dispatch, cached dispatch and combine
    if sms is not None:
        assert used == {sms}


def test_combine_pads_fewer_rows_back_to_the_received_count() -> None:
    engine, _ = _engine(None)
    x, idx, w = _routing()
    got = engine.dispatch(x, idx, w, None, EXPERTS)
    out = engine.combine(got.recv_x[: got.num_rows], got.handle)
    assert out.shape == (x.shape[0], HIDDEN)


GIN_ASSERT = (
    "Assertion exception (/tmp/dv2/deepep-v2/csrc/kernels/backend/nccl.cu:87): (allow_hybrid_mode ? "
    'props.railedGinType : props.ginType) != NCCL_GIN_TYPE_NONE and "NCCL GIN is unavailable. This is usually '
    'due to a network configuration issue, "'
)  # what ElasticBuffer raised on 2xH200 (NVLink only), results/h200x2-r4


def test_a_host_without_nccl_gin_is_one_clear_reason() -> None:
    from moelab.backends.base import CaseConfig
    from moelab.backends.deepep import V2_NO_GIN, DeepEPBackend, v2_buffer_problem
    from moelab.core.errors import BackendUnavailable
    from moelab.core.workload import Workload

    assert v2_buffer_problem(GIN_ASSERT) == V2_NO_GIN
    assert v2_buffer_problem("CUDA out of memory") is None

    class NoGinEP:
        def ElasticBuffer(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802 - the library's name
            raise RuntimeError(GIN_ASSERT)

    backend = DeepEPBackend.__new__(DeepEPBackend)  # only _make_v2 is exercised
    backend._ep = NoGinEP()
    backend.ctx = SimpleNamespace(group=None)  # type: ignore[assignment]
    case = CaseConfig(case_id="c", workload=Workload(hidden=8192, tokens_per_rank=4096, topk=8))
    with pytest.raises(BackendUnavailable, match="needs NCCL GIN"):
        backend._make_v2([case])
