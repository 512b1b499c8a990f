"""Hybrid-EP's backward (the e2e layer's dispatch of combine's gradient along the forward's handle) on a
stand-in HybridEPBuffer that keeps the library's own checks: on 2xH100 the forward+backward layer crashed
at EP=2 with `AssertionError: The number of experts should be provided on index-based routing` from
HybridEPBuffer.dispatch, which asks num_of_experts whenever no routing_map is given, handle or not
(deep_ep/hybrid_ep_buffer.py, branch hybrid-ep). The handle is read by name, never by position."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from moelab.backends.base import CaseConfig
from moelab.backends.hybrid_ep import HybridEPBackend
from moelab.backends.hybrid_ep_handle import PermuteHandle, PlainHandle, handle_fields_reason
from moelab.backends.input_cache import InputCache
from moelab.core.workload import Workload

WORLD, EPR, TOPK, TOKENS, HIDDEN = 2, 4, 2, 6, 16


class StandInBuffer:
    """HybridEPBuffer.dispatch's argument checks as the library makes them, on CPU: rank 0 of 2 receives
    every token once (no real exchange), with the plain path's 7-field handle."""

    local_rank = 0

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def dispatch(
        self,
        hidden: torch.Tensor,
        scaling_factor: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        num_of_experts: int | None = None,
        probs: torch.Tensor | None = None,
        routing_map: torch.Tensor | None = None,
        num_dispatched_tokens_tensor: torch.Tensor | None = None,
        num_dispatched_tokens: int | None = None,
        handle: tuple[Any, ...] | None = None,
    ) -> tuple[Any, ...]:
        self.calls.append({"handle": handle is not None, "num_dispatched_tokens": num_dispatched_tokens})
        if routing_map is None:
            assert num_of_experts is not None, (
                "The number of experts should be provided on index-based routing."
            )
            if topk_idx is not None:
                routing_map = torch.zeros(hidden.shape[0], num_of_experts, dtype=torch.bool)
                routing_map.scatter_(1, topk_idx, True)
                probs = torch.zeros(hidden.shape[0], num_of_experts).scatter(1, topk_idx, topk_weights)
        assert handle is not None or routing_map is not None, (
            "The handle and routing_map should not be both None"
        )
        if handle is not None:
            (_, _, _, _, _, _, _) = handle  # the library unpacks the legacy tuple field by field
        else:
            assert routing_map is not None
            handle = (
                torch.arange(hidden.shape[0]),
                None,
                None,
                torch.tensor([hidden.shape[0]]),
                routing_map[:, :EPR].clone(),
                hidden.shape[0],
                "config",
            )
        return hidden.clone(), probs, scaling_factor, handle

    def combine(
        self, hidden: torch.Tensor, probs: Any = None, handle: Any = None
    ) -> tuple[torch.Tensor, None]:
        assert handle is not None, "The handle is necessary for combine."
        return hidden.clone(), None


def _backend(buf: StandInBuffer) -> HybridEPBackend:
    backend = HybridEPBackend.__new__(HybridEPBackend)  # no deep_ep build here: the buffer is a stand-in
    backend.ctx = types.SimpleNamespace(world=WORLD)  # type: ignore[assignment]
    backend._buffers = {(None, False, EPR, None): buf}
    backend._kernels = None
    backend._cast_cache = InputCache()
    workload = Workload(hidden=HIDDEN, tokens_per_rank=TOKENS, topk=TOPK, experts_per_rank=EPR)
    backend.prepare(CaseConfig(case_id="c", workload=workload))
    return backend


def test_the_backward_dispatch_along_a_handle_names_the_experts() -> None:
    buf = StandInBuffer()
    backend = _backend(buf)
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [0, 5], [1, 2], [3, 0], [2, 1]])
    forward = backend.dispatch(x, idx, torch.full((TOKENS, TOPK), 0.5))
    assert isinstance(forward.handle.lib, PlainHandle)  # read by name from here on
    assert forward.handle.lib.num_of_tokens_per_rank == TOKENS
    grad = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    rows = backend.dispatch_with_handle(grad, forward.handle)  # raised the library's AssertionError before
    assert torch.equal(rows, grad)
    assert buf.calls[-1] == {"handle": True, "num_dispatched_tokens": TOKENS}  # no host sync on the way back
    assert backend.dispatch_with_handle_reason() is None


def test_a_handle_of_another_shape_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="handle of 9 fields where moelab reads 11"):
        PermuteHandle.of(tuple(range(9)))  # the permute handle before DeepEP's 17cfb81 (row_id_map)
    impl = types.SimpleNamespace(**dict.fromkeys(PlainHandle._fields + PermuteHandle._fields))
    assert handle_fields_reason(impl) is None
    del impl.dense_to_expert_map
    assert "has no dense_to_expert_map" in str(handle_fields_reason(impl))
