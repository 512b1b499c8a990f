"""A schedule and its serial baseline timed interleaved (Clock.sample_interleaved, used by the e2e layer's
time_ops): two ops that do the same work read the same while the machine drifts under them, where timed
one block after the other they read far apart (what made one serial layer read 0.91-1.06x itself on
4 x H200). Real gloo ranks, the CPU clock."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from moelab.core.spec import TimingSpec
from moelab.measure.e2e.bench import PAIRED_OPS, E2ECalls, time_ops
from moelab.measure.timing import Clock
from tests.distributed_helpers import run_ranks

pytestmark = pytest.mark.slow  # real gloo ranks

BASE_S, DRIFT_S = 0.002, 0.0004  # each call of either op takes longer than the last: a machine slowing


class Drifting:
    """Ops that do the same work, each call slower than any before it (one counter for all of them) and
    each logging its name, so the test sees the order the clock ran them in."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def op(self, name: str) -> Any:
        def call() -> None:
            self.calls.append(name)
            time.sleep(BASE_S + DRIFT_S * len(self.calls))

        return call


def _clock() -> Clock:
    return Clock(torch.device("cpu"), dist.group.WORLD, flush_l2=False)


def _clock_rank(rank: int, world: int) -> dict[str, Any]:
    clock = _clock()
    d = Drifting()
    apart = [clock.sample(d.op("a"), 8, 1), clock.sample(d.op("b"), 8, 1)]
    d2 = Drifting()
    side = clock.sample_interleaved([d2.op("a"), d2.op("b")], 8, 1)
    return {"apart": apart, "side": side, "order": d2.calls}


def test_interleaved_iterations_cancel_a_drift_that_blocks_do_not() -> None:
    for r in run_ranks(2, _clock_rank):
        a, b = (float(np.median(x)) for x in r["apart"])
        assert b / a > 1.5, (a, b)  # one block after the other: the same work reads 50% apart
        a, b = (float(np.median(x)) for x in r["side"])
        assert abs(b / a - 1) < 0.15, (a, b)
        # one warm-up each, then A B, B A, A B, ...: neither op always goes first
        assert r["order"] == ["a", "b"] + ["a", "b", "b", "a"] * 4
        assert all(len(x) == 8 and min(x) > 0 for x in r["side"])


def _time_ops_rank(rank: int, world: int) -> dict[str, Any]:
    d = Drifting()
    names = ("layer", "compute_only", "dispatch", "layer_serial")
    calls = E2ECalls(
        forward={n: d.op(n) for n in names},
        under_comm=None,  # type: ignore[arg-type]  # profile "layer" below: not timed
        fwd_bwd={n: d.op(n) for n in ("layer_fwd_bwd", "layer_fwd_bwd_serial")},
        pairs=0,
    )
    inputs = SimpleNamespace(
        settings=SimpleNamespace(profile="layer"), weights=SimpleNamespace(zero_grad=lambda: None)
    )
    timing = TimingSpec(warmup=1, iters=6, pair_reps=1, pair_iters=1, flush_l2=False)
    local = time_ops(_clock(), timing, calls, inputs)  # type: ignore[arg-type]
    return {"local": local, "order": d.calls}


def test_time_ops_times_each_schedule_beside_its_serial_baseline() -> None:
    assert PAIRED_OPS == {"layer": "layer_serial", "layer_fwd_bwd": "layer_fwd_bwd_serial"}
    for r in run_ranks(2, _time_ops_rank):
        local, order = r["local"], r["order"]
        assert set(local) == {
            "layer", "compute_only", "dispatch", "layer_serial", "layer_fwd_bwd", "layer_fwd_bwd_serial"
        }  # fmt: skip
        assert all(len(v) == 6 for v in local.values())
        # the layer and its serial baseline alternate; the ops between run in their own blocks after
        first = order.index("layer")
        assert order[first : first + 2 + 12] == ["layer", "layer_serial"] + ["layer", "layer_serial",
            "layer_serial", "layer"] * 3  # fmt: skip
        assert "compute_only" not in order[first : first + 14]
        for op, serial in PAIRED_OPS.items():
            ratio = float(np.median(local[serial])) / float(np.median(local[op]))
            assert abs(ratio - 1) < 0.15, (op, ratio)
        # an op timed in its own block later reads the drift: the same work, slower
        assert np.median(local["dispatch"]) > 1.15 * np.median(local["compute_only"])
