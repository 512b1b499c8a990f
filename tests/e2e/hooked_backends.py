"""Backends with a RecvHook for the hooked schedule's CPU tests (gloo has no split send/receive): the hook
runs the dispatch when called, which exercises the schedule's order of sends, receives and combines, and
its gradients. Shared by tests/e2e/test_e2e_gloo.py and tests/e2e/test_pair_counts.py."""

from __future__ import annotations

from collections.abc import Callable

import torch

from moelab.backends.base import Dispatched
from moelab.backends.mxfp8_a2a import Mxfp8A2ABackend
from moelab.backends.nccl_a2a import NcclA2ABackend


class HookedA2A(NcclA2ABackend):
    """nccl-a2a with a RecvHook. Its fresh dispatch syncs inside the backend, so a test of the layer's own
    host reads counts only those."""

    def dispatch_hooked(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Callable[[], Dispatched]:
        return lambda: self.dispatch(x, topk_idx, topk_weights)


class HookedMxfp8(Mxfp8A2ABackend):
    """mxfp8-a2a (the payload quantized on the wire) with the same test hook."""

    dispatch_hooked = HookedA2A.dispatch_hooked
