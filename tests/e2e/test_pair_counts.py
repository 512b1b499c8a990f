"""The overlapped layer reads its micro-batches' pair counts once, before the first payload: no host read in
the per-micro-batch path (forward or backward), and the same bits as the syncing path, on real gloo ranks."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.backends.base import CaseConfig
from moelab.backends.nccl_a2a import NcclA2ABackend
from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure.e2e.layer import MoELayer, layer_tokens, local_expert_weights, output_grad
from moelab.measure.e2e.overlap import (
    Streams,
    expert_parts,
    forward_expert_pipelined,
    forward_hooked,
    forward_pipelined,
    token_parts,
)
from moelab.measure.e2e.pair_counts import start_pair_counts
from moelab.measure.e2e.permute import pair_map
from tests.distributed_helpers import gloo_context, run_ranks
from tests.e2e.hooked_backends import HookedA2A, HookedMxfp8

# every way a tensor's value reaches the host from Python (torch.nonzero, boolean masks and the like do it
# inside C++ and are listed in the audit instead: none of them is on the path)
HOST_READS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")
E2E_DIR = os.path.join("moelab", "measure", "e2e")


@contextlib.contextmanager
def host_reads(log: list[str], armed: Callable[[], bool]) -> Iterator[None]:
    """Record (as `method file:line` of the caller) every host read of a tensor while `armed()`."""
    import sys

    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def spy(name: str) -> Callable[..., Any]:
        real = saved[name]

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if armed():
                f = sys._getframe(1)
                log.append(f"{name} {f.f_code.co_filename}:{f.f_lineno}")
            return real(self, *args, **kwargs)

        return read

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, spy(name))
        yield
    finally:
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)


class SpiedLayer(MoELayer):
    """Arms the spy inside each micro-batch's dispatch / receive, expert compute and combine."""

    armed = False

    @contextlib.contextmanager
    def _arm(self) -> Iterator[None]:
        before, SpiedLayer.armed = SpiedLayer.armed, True
        try:
            yield
        finally:
            SpiedLayer.armed = before

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        with self._arm():
            return super().dispatch(*args, **kwargs)

    def receive(self, *args: Any, **kwargs: Any) -> Any:
        with self._arm():
            return super().receive(*args, **kwargs)

    def experts(self, *args: Any, **kwargs: Any) -> Any:
        with self._arm():
            return super().experts(*args, **kwargs)

    def combine(self, *args: Any, **kwargs: Any) -> Any:
        with self._arm():
            return super().combine(*args, **kwargs)


BACKENDS = {"nccl-a2a": HookedA2A, "mxfp8-a2a": HookedMxfp8}

SCHEDULES = (  # (schedule, micro-batches or groups, GEMM)
    ("tbo", 2, "loop"),
    ("tbo", 2, "grouped"),
    ("chunked", 3, "padded"),
    ("expert", 2, "loop"),
    ("expert", 3, "padded"),
    ("hook", 2, "loop"),
)


def _schedules_rank(
    rank: int, world: int, wl: Workload, backend_name: str, exchange: str
) -> list[dict[str, Any]]:
    """Per schedule and per host_counts (True, False): output and gradients, and the host reads made in the
    per-micro-batch path (forward), and in backward."""
    case = CaseConfig(case_id="t", workload=wl, knobs={"exchange": exchange})
    backend = BACKENDS[backend_name](gloo_context(rank, world), [case])
    backend.prepare(case)
    r = route_all(wl, world)[rank]
    seed = wl.routing.seed
    x = layer_tokens(seed, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    gout = output_grad(seed, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    out = []
    for mode, chunks, gemm in SCHEDULES:
        if gemm == "grouped" and not hasattr(torch, "_grouped_mm"):
            gemm = "loop"
        for counted in (True, False):
            w = local_expert_weights(
                seed, rank, wl.experts_per_rank, wl.hidden, 16, torch.device("cpu"), True
            )
            layer = SpiedLayer(backend, w, wl.experts_per_rank, gemm)
            fn = {"expert": forward_expert_pipelined, "hook": forward_hooked}.get(mode, forward_pipelined)
            streams = Streams(torch.device("cpu"))
            fwd: list[str] = []
            with host_reads(fwd, lambda: SpiedLayer.armed), torch.no_grad():
                y = fn(layer, x, r.topk_idx, r.topk_weights, chunks, streams, host_counts=counted)
            xg = x.detach().requires_grad_(True)
            yg = fn(layer, xg, r.topk_idx, r.topk_weights, chunks, streams, host_counts=counted)
            bwd: list[str] = []
            with host_reads(bwd, lambda: True):
                yg.backward(gout)
            assert xg.grad is not None and w.w13.grad is not None and w.w2.grad is not None
            out.append(
                {
                    "schedule": (mode, chunks, gemm, counted),
                    "tensors": [
                        t.detach().float().numpy().copy() for t in (y, yg, xg.grad, w.w13.grad, w.w2.grad)
                    ],
                    "fwd": fwd,
                    "bwd": bwd,
                }
            )
    return out


def _in_layer(reads: list[str]) -> list[str]:
    return [r for r in reads if E2E_DIR in r]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "backend", "exchange"),
    [
        (2, "nccl-a2a", "splits"),
        (3, "nccl-a2a", "splits"),
        (2, "nccl-a2a", "allgather"),
        (2, "mxfp8-a2a", "splits"),
    ],
)
def test_overlapped_schedules_make_no_host_read_per_micro_batch_and_keep_their_bits(
    world: int, backend: str, exchange: str
) -> None:
    """With the counts read up front, no micro-batch's dispatch, grouping, expert compute or combine reads a
    tensor on the host (tbo, chunked, expert: none at all; hook: none of the layer's own, its backend's
    fresh dispatch syncs inside), nor does backward; the syncing path (host_counts=False) does read, and
    both give the same bits, forward and backward."""
    wl = Workload(hidden=64, tokens_per_rank=24, topk=4, experts_per_rank=3, routing=RoutingSpec(seed=5))
    per_rank = run_ranks(world, _schedules_rank, wl, backend, exchange)
    for rank, results in enumerate(per_rank):
        by_key = {res["schedule"]: res for res in results}
        for mode, chunks, gemm in {res["schedule"][:3] for res in results}:
            fast, slow = by_key[(mode, chunks, gemm, True)], by_key[(mode, chunks, gemm, False)]
            where = (rank, mode, chunks, gemm)
            assert (_in_layer(fast["fwd"]) if mode == "hook" else fast["fwd"]) == [], where
            assert _in_layer(slow["fwd"]), where  # the test can fail: the syncing path reads in pair_map
            assert fast["bwd"] == [] and slow["bwd"] == [], where
            for a, b in zip(fast["tensors"], slow["tensors"], strict=True):
                np.testing.assert_array_equal(a, b, err_msg=str(where))


def _counts_rank(rank: int, world: int, wl: Workload) -> list[list[tuple[int, ...]]]:
    """The up-front counts against the counts of what each micro-batch actually received."""
    case = CaseConfig(case_id="t", workload=wl)
    backend = NcclA2ABackend(gloo_context(rank, world), [case])
    backend.prepare(case)
    r = route_all(wl, world)[rank]
    x = layer_tokens(0, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    epr = wl.experts_per_rank
    got = []
    for parts in (
        token_parts(x, r.topk_idx, r.topk_weights, 3),
        expert_parts(x, r.topk_idx, r.topk_weights, epr, 2),
    ):
        up_front = start_pair_counts(backend, [p.topk_idx for p in parts], epr).result()
        received = []
        for p in parts:
            d = backend.dispatch(p.x, p.topk_idx, p.topk_weights)
            valid = d.recv_topk_idx[(d.recv_topk_idx >= 0) & (d.recv_topk_idx < epr)]
            received.append(tuple(torch.bincount(valid, minlength=epr).tolist()))
        got.append([*up_front, *received])
    return got


@pytest.mark.slow
def test_up_front_counts_are_the_pairs_each_rank_receives() -> None:
    wl = Workload(hidden=32, tokens_per_rank=20, topk=3, experts_per_rank=4, routing=RoutingSpec(seed=9))
    for per_parts in run_ranks(3, _counts_rank, wl):
        for both in per_parts:
            half = len(both) // 2
            assert both[:half] == both[half:]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 12),
    topk=st.integers(1, 4),
    experts=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_pair_map_with_host_counts_is_bit_identical_and_reads_nothing(
    rows: int, topk: int, experts: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, experts + 2, (rows, topk), generator=g)  # -1 and other ranks' ids too
    w = torch.rand(rows, topk, generator=g)
    local = idx[(idx >= 0) & (idx < experts)]
    counts = torch.bincount(local, minlength=experts).tolist() if experts else []
    reads: list[str] = []
    with host_reads(reads, lambda: True):
        fast, fast_off = pair_map(idx, w, experts, counts)
    slow, slow_off = pair_map(idx, w, experts)
    assert reads == []
    assert torch.equal(fast_off, slow_off)
    key = torch.where((idx >= 0) & (idx < experts), idx, experts).reshape(-1)
    before = torch.cumsum(torch.bincount(key, minlength=experts + 1)[:experts], 0).to(torch.int32)
    assert torch.equal(fast_off, before) and fast_off.dtype == torch.int32  # the offsets bincount gave
    assert (fast.num_pairs, fast.max_group) == (slow.num_pairs, slow.max_group)
    for a, b in zip(fast.tensors(), slow.tensors(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="pair counts for"):
        pair_map(idx, w, experts, [*counts, 0])
