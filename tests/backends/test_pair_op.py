"""The chained pair op (issue 29, item 5): dispatch then combine back to back with no host sync, K pairs
per timed iteration, period = time / K; timed for every backend whose calls chain (capability
ChainedPairs, a type the backend has, never a name) and stored beside roundtrip."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from moelab.backends import registry
from moelab.backends.capabilities import ChainedPairs, chains_pairs, pair_sync_reason
from moelab.core.ops import OPS, ops_for
from moelab.core.spec import TimingSpec
from moelab.measure.timing import Clock
from tests.distributed_helpers import run_ranks


def test_the_built_ins_that_chain_declare_it() -> None:
    chaining = ("nccl-a2a", "mxfp8-a2a", "torch-symm-a2a", "nccl-ep", "deepep", "deepep-ll", "uccl-ep")
    assert all(issubclass(registry.load(n), ChainedPairs) for n in chaining)
    # Hybrid-EP's dispatch reads the received count back to the host (no num_dispatched_tokens passed)
    assert not issubclass(registry.load("hybrid-ep"), ChainedPairs)


class _Backend(ChainedPairs):
    def __init__(self, phases: bool, syncs: dict[str, str]) -> None:
        self.phases, self.syncs = phases, syncs

    def splits_phases(self) -> bool:
        return self.phases

    def host_sync_ops(self) -> dict[str, str]:
        return self.syncs


def test_a_host_sync_on_the_pairs_calls_keeps_it_out() -> None:
    # nccl-a2a's split exchange: the layout syncs, the dispatch along it does not
    splits = {"layout": "counts to the host", "dispatch_fresh": "counts to the host"}
    assert chains_pairs(_Backend(True, splits))
    # DeepEP V2 times dispatch whole: the pair would be its fresh dispatch, which waits for the counts
    whole = _Backend(False, {"dispatch_fresh": "do_cpu_sync=True"})
    assert not chains_pairs(whole)
    assert pair_sync_reason(whole) == "the pair would synchronise the host (dispatch_fresh: do_cpu_sync=True)"
    assert not chains_pairs(object())  # a plugin that declares nothing gets no pair op


def test_the_pair_op_is_listed_only_where_calls_chain() -> None:
    assert "pair" in OPS and OPS["pair"].needs_chaining
    assert ops_for(True) == ("layout", "dispatch", "dispatch_fresh", "combine", "roundtrip")
    assert ops_for(True, chains=True)[-2:] == ("roundtrip", "pair")
    assert ops_for(False, chains=True) == ("dispatch_fresh", "combine", "roundtrip", "pair")


PAIR_S = 0.004


def _period(rank: int, world: int) -> dict[str, Any]:
    calls = 0

    def pair() -> None:
        nonlocal calls
        calls += 1
        time.sleep(PAIR_S)

    clock = Clock(torch.device("cpu"), dist.group.WORLD, flush_l2=False)
    timing = TimingSpec(iters=6, warmup=1, chain=5)
    sampled = clock.sample_until_stable(pair, timing, repeat=timing.chain)
    return {"calls": calls, "samples": sampled.samples_us}


@pytest.mark.slow
def test_k_pairs_per_iteration_and_the_period_is_time_over_k() -> None:
    for out in run_ranks(2, _period):
        assert out["calls"] == 1 + 6 * 5  # warm-up, then 6 iterations of 5 chained pairs
        assert len(out["samples"]) == 2 and all(len(r) == 6 for r in out["samples"])
        mine = sorted(out["samples"][0])
        assert PAIR_S * 1e6 <= mine[3] < 2 * PAIR_S * 1e6  # one pair's time, not five
