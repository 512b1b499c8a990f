"""One count exchange and one host read for every part's layout and pair counts (BatchedLayout on nccl-a2a
and mxfp8-a2a), the library's own counts where its dispatch reads them (HostExpertCounts, DeepEP V1): the
same handles, rows and bits as laying out each part alone, with fewer collectives before the first payload,
on real gloo ranks and through `moelab run`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from moelab.backends.base import CaseConfig, Dispatched
from moelab.backends.capabilities import PartLayouts
from moelab.backends.deepep import expert_counts
from moelab.backends.mxfp8_a2a import Mxfp8A2ABackend
from moelab.backends.nccl_a2a import A2AHandle, NcclA2ABackend
from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure.e2e import layer as layer_module
from moelab.measure.e2e.layer import MoELayer, layer_tokens, local_expert_weights, output_grad
from moelab.measure.e2e.overlap import Part, expert_parts, token_parts
from moelab.measure.e2e.pair_counts import start_pair_counts
from tests.distributed_helpers import gloo_context, groups_left, run_ranks
from tests.e2e.cli_suite import run_nccl_a2a_e2e
from tests.e2e.test_e2e_layer import Loopback
from tests.e2e.test_pair_counts import SpiedLayer, _in_layer, host_reads

COLLECTIVES = ("all_to_all", "all_to_all_single", "all_reduce", "all_gather_into_tensor", "all_gather_single")


@contextmanager
def collectives(log: list[str]) -> Iterator[None]:
    """Record the name of every torch.distributed collective called inside."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def spy(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            log.append(name)
            return saved[name](*args, **kwargs)

        return call

    try:
        for name in saved:
            setattr(dist, name, spy(name))
        yield
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)


class UnbatchedA2A(NcclA2ABackend):
    """nccl-a2a laying out each part on its own (the path before BatchedLayout)."""

    def layouts(self, routings: Any) -> PartLayouts | None:
        return None


class UnbatchedMxfp8(Mxfp8A2ABackend):
    layouts = UnbatchedA2A.layouts


PAIRS = {"nccl-a2a": (NcclA2ABackend, UnbatchedA2A), "mxfp8-a2a": (Mxfp8A2ABackend, UnbatchedMxfp8)}


def _parts(x: torch.Tensor, r: Any, epr: int) -> dict[str, list[Part]]:
    return {
        "tbo": token_parts(x, r.topk_idx, r.topk_weights, 2),
        "chunked3": token_parts(x, r.topk_idx, r.topk_weights, 3),
        "expert2": expert_parts(x, r.topk_idx, r.topk_weights, epr, 2),
    }


def _handle_fields(h: A2AHandle) -> tuple[Any, ...]:
    return (h.send_splits, h.recv_splits, h.num_tokens, h.send_tok.tolist())


def _layouts_rank(rank: int, world: int, wl: Workload, name: str) -> dict[str, Any]:
    batched_cls, alone_cls = PAIRS[name]
    knobs = {"exchange": "splits", **({"quantizer": "torch"} if name == "mxfp8-a2a" else {})}
    case = CaseConfig(case_id="t", workload=wl, knobs=knobs)
    ctx = gloo_context(rank, world)
    batched, alone = batched_cls(ctx, [case]), alone_cls(ctx, [case])
    batched.prepare(case)
    alone.prepare(case)
    r = route_all(wl, world)[rank]
    epr = wl.experts_per_rank
    x = layer_tokens(3, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    out: dict[str, Any] = {}
    for label, parts in _parts(x, r, epr).items():
        routings = [(p.topk_idx, p.topk_weights) for p in parts]
        calls: list[str] = []
        with collectives(calls):
            got = batched.layouts(routings)
        assert got is not None
        pending = start_pair_counts(alone, [p.topk_idx for p in parts], epr)
        own = [alone.layout(p.topk_idx, p.topk_weights) for p in parts]
        received = []
        for p, h, o in zip(parts, got.handles, own, strict=True):
            assert h.unsent_routing is not None  # its routing goes behind its payload
            d: Dispatched = batched.dispatch(p.x, p.topk_idx, p.topk_weights, layout=h)
            e: Dispatched = alone.dispatch(p.x, p.topk_idx, p.topk_weights, layout=o)
            received.append(
                (
                    _handle_fields(h) == _handle_fields(o),
                    h.unsent_routing is None,
                    [t.clone().numpy() for t in (d.recv_x.float(), d.recv_topk_idx, d.recv_topk_weights)],
                    [t.clone().numpy() for t in (e.recv_x.float(), e.recv_topk_idx, e.recv_topk_weights)],
                )
            )
        out[label] = {
            "collectives": calls,
            "counts": (got.pair_counts, pending.result()),
            "received": received,
        }
    batched.close()
    alone.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), [(2, "nccl-a2a"), (3, "nccl-a2a"), (2, "mxfp8-a2a")])
def test_batched_layouts_are_each_parts_own_from_one_exchange(world: int, name: str) -> None:
    """Same splits, send order, received rows and routing, and the pair counts of the all-reduce path, from
    one collective for every part (each part alone takes two: its counts and its routing rows)."""
    wl = Workload(
        hidden=64, tokens_per_rank=21, topk=3, experts_per_rank=2, routing=RoutingSpec(kind="zipf", seed=4)
    )
    if name == "mxfp8-a2a":
        wl = Workload(hidden=64, tokens_per_rank=21, topk=3, experts_per_rank=2, dtype="mxfp8")
    for rank, per_label in enumerate(run_ranks(world, _layouts_rank, wl, name)):
        for label, got in per_label.items():
            where = (rank, label)
            assert got["collectives"] == ["all_to_all_single"], where
            batched_counts, all_reduced = got["counts"]
            assert batched_counts == all_reduced, where
            for same_handle, sent, mine, theirs in got["received"]:
                assert same_handle and sent, where
                for a, b in zip(mine, theirs, strict=True):
                    np.testing.assert_array_equal(a, b, err_msg=str(where))


def _front_rank(rank: int, world: int, wl: Workload) -> dict[str, list[str]]:
    case = CaseConfig(case_id="t", workload=wl, knobs={"exchange": "splits"})
    r = route_all(wl, world)[rank]
    x = layer_tokens(0, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    weights = local_expert_weights(0, rank, wl.experts_per_rank, wl.hidden, 16, torch.device("cpu"))
    out = {}
    for label, cls in (("batched", NcclA2ABackend), ("alone", UnbatchedA2A)):
        backend = cls(gloo_context(rank, world), [case])
        backend.prepare(case)
        layer = MoELayer(backend, weights, wl.experts_per_rank, "loop")
        parts = token_parts(x, r.topk_idx, r.topk_weights, 2)
        calls: list[str] = []
        with collectives(calls):
            layer.part_layouts([(p.topk_idx, p.topk_weights) for p in parts])
        out[label] = calls
        backend.close()
    return out


@pytest.mark.slow
def test_the_overlapped_layers_front_is_one_collective() -> None:
    """Before tbo's first payload: one exchange with BatchedLayout; the all-reduce of the pair counts and
    two per micro-batch (counts, routing rows) without it."""
    wl = Workload(hidden=32, tokens_per_rank=16, topk=2, experts_per_rank=3)
    for got in run_ranks(2, _front_rank, wl):
        assert got["batched"] == ["all_to_all_single"]
        assert got["alone"] == ["all_reduce"] + ["all_to_all_single", "all_to_all_single"] * 2


def _serial_rank(rank: int, world: int, wl: Workload, gemm: str) -> dict[str, Any]:
    case = CaseConfig(case_id="t", workload=wl, knobs={"exchange": "splits"})
    r = route_all(wl, world)[rank]
    seed = wl.routing.seed
    x = layer_tokens(seed, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    gout = output_grad(seed, rank, wl.tokens_per_rank, wl.hidden, "cpu")
    out: dict[str, Any] = {}
    for label, cls in (("batched", NcclA2ABackend), ("alone", UnbatchedA2A)):
        backend = cls(gloo_context(rank, world), [case])
        backend.prepare(case)
        w = local_expert_weights(seed, rank, wl.experts_per_rank, wl.hidden, 16, torch.device("cpu"), True)
        layer = SpiedLayer(backend, w, wl.experts_per_rank, gemm)
        reads: list[str] = []
        with host_reads(reads, lambda: SpiedLayer.armed), torch.no_grad():
            y = layer.forward(x, r.topk_idx, r.topk_weights)
        xg = x.detach().requires_grad_(True)
        layer.forward(xg, r.topk_idx, r.topk_weights).backward(gout)
        assert xg.grad is not None and w.w13.grad is not None and w.w2.grad is not None
        out[label] = {
            "reads": reads,
            "tensors": [
                t.detach().float().numpy().copy()
                for t in (y, xg.grad, w.w13.grad, w.w2.grad)
                if t is not None
            ],
        }
        backend.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("gemm", ["loop", "padded"])
def test_serial_layer_reads_nothing_after_its_layout_and_keeps_its_bits(gemm: str) -> None:
    """The serial layer on nccl-a2a lays out first (one read, counts included): no host read in its
    dispatch, grouping, expert compute or combine, where the per-part path reads in the grouping (and, for
    the loop, the GEMM sizes); forward and backward give the same bits either way."""
    wl = Workload(hidden=64, tokens_per_rank=24, topk=4, experts_per_rank=3, routing=RoutingSpec(seed=2))
    for rank, got in enumerate(run_ranks(2, _serial_rank, wl, gemm)):
        assert got["batched"]["reads"] == [], rank
        assert got["alone"]["reads"], rank  # the test can fail: the old path reads in pair_map
        for a, b in zip(got["batched"]["tensors"], got["alone"]["tensors"], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=str(rank))


class CountingLoopback(Loopback):
    """One rank; its dispatch reports each expert's pairs on the host, as DeepEP V1's does."""

    phases = True

    def __init__(self, experts: int) -> None:
        self.experts = experts

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        return None

    def dispatch(  # type: ignore[override]
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        d = super().dispatch(x, topk_idx, topk_weights)
        valid = topk_idx[(topk_idx >= 0) & (topk_idx < self.experts)]
        d.recv_expert_counts = tuple(torch.bincount(valid, minlength=self.experts).tolist())
        return d

    def expert_counts_on_host(self) -> bool:
        return True


def test_library_counts_spare_the_layer_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend whose dispatch reads the pair counts (HostExpertCounts): no pair-count all-reduce up
    front, and no host read in the grouping, serial or overlapped."""
    experts, tokens = 4, 12
    g = torch.Generator().manual_seed(1)
    idx = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :2]
    w = torch.rand(tokens, 2, generator=g)
    x = torch.randn(tokens, 32, generator=g).to(torch.bfloat16)
    weights = local_expert_weights(0, 0, experts, 32, 8, torch.device("cpu"))
    layer = SpiedLayer(CountingLoopback(experts), weights, experts, "padded")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the library's counts make the layer's all-reduce needless")

    monkeypatch.setattr(layer_module, "start_pair_counts", refuse)
    layouts, counts = layer.part_layouts([(idx[:6], w[:6]), (idx[6:], w[6:])])
    assert layouts == [None, None] and counts == [None, None]
    reads: list[str] = []
    with host_reads(reads, lambda: SpiedLayer.armed), torch.no_grad():
        y = layer.forward(x, idx, w)
    assert reads and _in_layer(reads) == [] and y.shape == x.shape  # the library's own read only
    plain = MoELayer(Loopback(), weights, experts, "padded")
    with torch.no_grad():
        torch.testing.assert_close(y, plain.forward(x, idx, w), rtol=0, atol=0)


def test_deepeps_per_expert_list_becomes_the_pair_counts() -> None:
    assert expert_counts([3, 0, 5], 3) == (3, 0, 5)
    assert expert_counts([], 3) is None  # num_worst_tokens > 0: DeepEP gives an empty list
    assert expert_counts(None, 2) is None  # the cached dispatch gives none
    assert expert_counts([1, 2], 3) is None


@pytest.mark.slow
def test_moelab_run_e2e_on_nccl_a2a_says_its_one_read(tmp_path: Path, db_path: Path) -> None:
    """Through the command: the serial and tbo layers on nccl-a2a pass their correctness check (outputs
    and gradients) and the stored host-sync note names the one count exchange."""
    rows = run_nccl_a2a_e2e(
        tmp_path,
        db_path,
        "one-read",
        {"hidden": 64, "tokens_per_rank": 24, "topk": 4, "experts_per_rank": 3, "routing": "zipf"},
        {
            "mode": ["serial", "tbo", "expert"],
            "backward": [True],
            "exchange": ["splits"],
            "intermediate": [16],
        },
        "status",
        "host_sync",
        "json_extract_string(backend_record, '$.e2e.mode')",
    )
    assert {r[2] for r in rows} == {"serial", "tbo", "expert"}, rows
    for status, host_sync, _ in rows:
        assert status == "ok" and "one count exchange and one device-to-host read" in host_sync, rows
    assert groups_left(tmp_path / "runs" / "one-read") == {}  # the layer's ranks end their groups too
