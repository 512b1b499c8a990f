"""HybridEPBuffer's layout step is sized by the routing it is given (a two-batch overlap lays out
micro-batches of half the case's tokens), not by the case's token count: on 2xH200 the e2e layer's tbo
schedule failed with combine returning 8192 rows for a 4096-token reference when it was."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from moelab.backends.base import CaseConfig
from moelab.backends.hybrid_ep import HybridEPBackend
from moelab.core.workload import Workload


class _Recorder:
    """The HybridEPBuffer calls layout() makes, with the token counts they were given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.runtime = self

    def update_template_config(self, hidden_dim: int, num_of_tokens_per_rank: int) -> str:
        self.calls.append(("config", num_of_tokens_per_rank))
        return "config"

    def metadata_preprocessing(self, **kw: Any) -> Any:
        self.calls.append(("preprocess", kw["num_of_tokens_per_rank"]))
        assert kw["routing_map"].shape[0] == kw["num_of_tokens_per_rank"]
        return types.SimpleNamespace(
            sparse_to_dense_map=None, rdma_to_attn_map=None, attn_to_rdma_map=None,
            num_dispatched_tokens_tensor=None, local_expert_routing_map=None,
            num_of_tokens_per_rank=kw["num_of_tokens_per_rank"], config=kw["config"],
        )  # fmt: skip


def _indices_to_map(idx: torch.Tensor, w: torch.Tensor, num_tokens: int, num_experts: int) -> Any:
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    routing_map.scatter_(1, idx, True)  # fails if num_tokens is not the routing's own
    return routing_map, None


@pytest.mark.parametrize("micro_tokens", [2048, 4096, 33])
def test_layout_takes_the_routings_token_count(monkeypatch: pytest.MonkeyPatch, micro_tokens: int) -> None:
    module = types.ModuleType("deep_ep.hybrid_ep_buffer")
    module.indices_to_map = _indices_to_map  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deep_ep", types.ModuleType("deep_ep"))
    monkeypatch.setitem(sys.modules, "deep_ep.hybrid_ep_buffer", module)
    backend = HybridEPBackend.__new__(HybridEPBackend)  # no deep_ep build here: only layout() is exercised
    backend.ctx = types.SimpleNamespace(world=2)  # type: ignore[assignment]
    backend._case = CaseConfig(
        case_id="c", workload=Workload(hidden=512, tokens_per_rank=4096, topk=2, experts_per_rank=4)
    )
    recorder = _Recorder()
    backend._buf = recorder
    idx = torch.randint(0, 8, (micro_tokens, 2))
    handle = backend.layout(idx, torch.ones(micro_tokens, 2))
    assert recorder.calls == [("config", micro_tokens), ("preprocess", micro_tokens)]
    assert handle.lib.num_of_tokens_per_rank == micro_tokens
