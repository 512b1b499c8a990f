"""torch-symm-a2a's device-side routing math on the CPU: the layout, the packed rows, an emulated
all_to_all_vdev between ranks, and the received rows and combine sums checked by moelab's own checks.
The real op runs in tests/gpu/test_symm_nccl_ep_gpu.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.backends import registry, torch_symm_a2a
from moelab.backends.padded import PaddedDispatched, pad_rows, received_rows
from moelab.backends.symm_layout import (
    EXCHANGE_BLOCK_BYTES,
    EXCHANGE_MAX_BLOCKS,
    EXCHANGE_MIN_BYTES,
    ROW_ALIGN_COLS,
    SPARE_ROWS,
    RowLayout,
    buffer_rows,
    exchange_align_cols,
    mask_received_meta,
    meta_ids,
    meta_weights,
    plan_layout,
    sum_at_source,
)
from moelab.core.routing import route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure import checks
from moelab.measure.reference import expert_output, make_tokens, reference_dispatch


def emulate_all_to_all_vdev(
    inputs: list[torch.Tensor], in_splits: list[torch.Tensor], capacity: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What torch.ops.symm_mem.all_to_all_vdev delivers, for tests: rank d receives, from every source s
    in rank order, the rows of s's d-th split, packed from row 0 of a `capacity`-row buffer.
    Returns (received buffers, out_splits_offsets [2, world] per rank)."""
    world = len(inputs)
    starts = [torch.cumsum(s, 0) - s for s in in_splits]
    outs, splits_offsets = [], []
    for d in range(world):
        recv = torch.zeros(capacity, *inputs[0].shape[1:], dtype=inputs[0].dtype)
        counts = torch.stack([in_splits[s][d] for s in range(world)])
        offsets = torch.cumsum(counts, 0) - counts
        for s in range(world):
            n, src, dst = int(counts[s]), int(starts[s][d]), int(offsets[s])
            recv[dst : dst + n] = inputs[s][src : src + n]
        outs.append(recv)
        splits_offsets.append(torch.stack([counts, offsets]))
    return outs, splits_offsets


def _emulated_round_trip(wl: Workload, world: int) -> tuple[list[PaddedDispatched], list[torch.Tensor]]:
    """Dispatch and combine of every rank, as the backend does them, with the exchange emulated."""
    routings = route_all(wl, world)
    rows = RowLayout(wl.hidden, wl.topk)
    capacity = wl.tokens_per_rank * world
    layouts, sends, xs = [], [], []
    for rank in range(world):
        r = routings[rank]
        lay = plan_layout(r.topk_idx, r.topk_weights, world, wl.experts_per_rank, capacity)
        x = make_tokens(wl, rank)
        send = torch.zeros(capacity, rows.width, dtype=torch.bfloat16)
        torch.index_select(x, 0, lay.gather_idx, out=rows.payload(send))
        rows.meta(send).copy_(lay.meta)
        layouts.append(lay)
        sends.append(send)
        xs.append(x)
    recvs, sos = emulate_all_to_all_vdev(sends, [lay.send_counts for lay in layouts], capacity)
    dispatched = []
    for rank in range(world):
        recv_counts = sos[rank][0]
        meta = mask_received_meta(
            rows.meta(recvs[rank]), recv_counts, torch.empty(capacity, 2 * wl.topk, dtype=torch.int32)
        )
        dispatched.append(
            PaddedDispatched(
                recv_x=rows.payload(recvs[rank]),
                recv_topk_idx=meta_ids(meta, wl.topk),
                recv_topk_weights=meta_weights(meta, wl.topk),
                handle=layouts[rank],
                recv_counts=recv_counts,
            )
        )
    # combine: each rank's expert rows (padded to capacity) go back along the received counts
    expert_rows = []
    for rank in range(world):
        d = dispatched[rank]
        got = received_rows(d)
        out = expert_output(got.recv_x, got.recv_topk_idx, got.recv_topk_weights, rank, wl.experts_per_rank)
        expert_rows.append(pad_rows(out, d))
    backs, _ = emulate_all_to_all_vdev(expert_rows, [d.recv_counts for d in dispatched], capacity)
    combined = []
    for rank in range(world):
        out = torch.empty(wl.tokens_per_rank + SPARE_ROWS, wl.hidden, dtype=torch.bfloat16)
        combined.append(sum_at_source(backs[rank], layouts[rank], out).clone())
    return dispatched, combined


@pytest.mark.parametrize(
    ("world", "routing"),
    [(2, "uniform"), (3, "zipf"), (4, "hot"), (2, "hot")],
)
def test_emulated_exchange_passes_the_checks(world: int, routing: str) -> None:
    wl = Workload(
        hidden=256, tokens_per_rank=48, topk=4, experts_per_rank=2, routing=RoutingSpec(kind=routing)
    )
    routings = route_all(wl, world)
    dispatched, combined = _emulated_round_trip(wl, world)
    for rank in range(world):
        expected = reference_dispatch(routings, rank, wl.experts_per_rank)
        dc = checks.check_dispatch(dispatched[rank], expected, wl, world)
        assert dc.ok, dc.message
        ok, err, msg = checks.check_combine(combined[rank], make_tokens(wl, rank), routings[rank], "bf16")
        assert ok, msg


def test_padding_rows_carry_no_expert() -> None:
    wl = Workload(hidden=128, tokens_per_rank=32, topk=2, experts_per_rank=4)
    dispatched, _ = _emulated_round_trip(wl, 4)
    for d in dispatched:
        n = d.valid_count()
        assert n < d.capacity  # topk 2 of 16 experts: no rank receives every token of every rank
        assert (d.recv_topk_idx[n:] == -1).all() and (d.recv_topk_weights[n:] == 0).all()
        assert (d.recv_topk_idx[:n] >= 0).any(dim=1).all()  # every received row has a local expert


def test_check_refuses_a_wrong_count() -> None:
    wl = Workload(hidden=128, tokens_per_rank=16, topk=2, experts_per_rank=2)
    routings = route_all(wl, 2)
    dispatched, _ = _emulated_round_trip(wl, 2)
    d = dispatched[0]
    d.recv_counts = d.recv_counts - torch.tensor([1, 0])
    dc = checks.check_dispatch(d, reference_dispatch(routings, 0, wl.experts_per_rank), wl, 2)
    assert not dc.ok and "rows" in dc.message


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 40),
    world=st.integers(1, 5),
    epr=st.integers(1, 3),
    topk=st.integers(1, 4),
    extra=st.integers(0, 7),
    seed=st.integers(0, 2**16),
)
def test_layout_split_math(tokens: int, world: int, epr: int, topk: int, extra: int, seed: int) -> None:
    topk = min(topk, world * epr)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(world * epr, generator=gen)[:topk] for _ in range(tokens)])
    w = torch.rand(tokens, topk, generator=gen)
    capacity = tokens * world + extra
    lay = plan_layout(idx, w, world, epr, capacity)
    dest = idx // epr
    want = torch.tensor([int((dest == r).any(dim=1).sum()) for r in range(world)])
    assert torch.equal(lay.send_counts, want)
    sent = int(want.sum())
    assert lay.gather_idx.shape == lay.scatter_idx.shape == (capacity,)
    # sent rows: destination-major, tokens ascending within a destination, each (token, rank) pair once
    start = 0
    for r in range(world):
        toks = lay.gather_idx[start : start + int(want[r])]
        assert torch.equal(toks, torch.nonzero((dest == r).any(dim=1)).squeeze(1))
        ids = meta_ids(lay.meta[start : start + int(want[r])], topk)
        ws = meta_weights(lay.meta[start : start + int(want[r])], topk)
        on = dest[toks] == r
        assert torch.equal(ids, torch.where(on, idx[toks] - r * epr, -1).to(torch.int32))
        assert torch.equal(ws, torch.where(on, w[toks], 0.0))
        start += int(want[r])
    assert torch.equal(lay.scatter_idx[:sent], lay.gather_idx[:sent])
    spare = lay.scatter_idx[sent:]
    assert ((spare >= tokens) & (spare < tokens + SPARE_ROWS)).all()
    assert (meta_ids(lay.meta[sent:], topk) == -1).all()


def test_plan_refuses_too_small_a_capacity() -> None:
    idx = torch.zeros(4, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="capacity"):
        plan_layout(idx, torch.ones(4, 1), 2, 1, 7)


@pytest.mark.parametrize(("hidden", "topk"), [(8192, 8), (7168, 8), (16, 1), (130, 3)])
def test_row_layout_keeps_rows_aligned(hidden: int, topk: int) -> None:
    rows = RowLayout(hidden, topk)
    assert rows.width % ROW_ALIGN_COLS == 0 and rows.width >= hidden + 4 * topk
    assert rows.meta_start >= hidden and rows.width - rows.meta_start == 4 * topk
    buf = torch.zeros(3, rows.width, dtype=torch.bfloat16)
    meta = rows.meta(buf)
    assert meta.shape == (3, 2 * topk) and meta.dtype == torch.int32
    meta.fill_(-1)
    assert (rows.payload(buf) == 0).all()


def test_reference_workload_row_is_64_bytes_of_metadata_over_the_payload() -> None:
    rows = RowLayout(8192, 8)
    assert 2 * rows.width == 8192 * 2 + 64


def test_signature_check() -> None:
    assert torch_symm_a2a.op_signature_problem(torch_symm_a2a.OP_ARGS) is None
    older = ("input", "out", "in_out_splits", "group_name")
    problem = torch_symm_a2a.op_signature_problem(older)
    assert problem is not None and "in_out_splits" in problem


def test_availability_without_gpu_names_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = registry.availability("torch-symm-a2a")
    assert reason is not None and "\n" not in reason
    assert "CUDA" in reason or "all_to_all_vdev" in reason


def test_availability_names_missing_nvshmem(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    if not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
        pytest.skip("this torch has no all_to_all_vdev")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(symm_mem, "is_nvshmem_available", lambda: False)
    reason = torch_symm_a2a.TorchSymmA2ABackend.availability()
    assert reason is not None and "NVSHMEM" in reason and "nvidia-nvshmem" in reason


def test_availability_names_a_torch_without_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.ops, "symm_mem", raising=False)
    reason = torch_symm_a2a.TorchSymmA2ABackend.availability()
    assert reason is not None and "all_to_all_vdev" in reason


def test_backend_contract_attributes() -> None:
    cls = torch_symm_a2a.TorchSymmA2ABackend
    assert cls.phases is True and cls.sm_control is None
    assert cls.host_sync_ops(object.__new__(cls)) == {}


def _torch_nblocks(buffer_bytes: int, world: int, max_blocks: int) -> int:
    """get_a2a_nblocks of torch's CUDA all_to_all_vdev."""
    blocks = -(-buffer_bytes // EXCHANGE_BLOCK_BYTES)
    return min(-(-blocks // world) * world, max_blocks)


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 16),
    hidden=st.integers(8, 9000).map(lambda h: 2 * h),
    topk=st.integers(1, 9),
    tokens=st.integers(1, 5000),
    sent=st.integers(0, 10**6),
)
def test_every_peer_splits_evenly_over_its_blocks(
    world: int, hidden: int, topk: int, tokens: int, sent: int
) -> None:
    """torch's pull kernel traps unless each peer's bytes divide by its blocks per peer."""
    rows = RowLayout(hidden, topk, exchange_align_cols(world))
    assert rows.width >= hidden + 4 * topk and rows.back_width >= hidden
    capacity = buffer_rows(tokens * world, rows.back_width)
    assert capacity >= tokens * world
    peer_rows = sent % (capacity + 1)
    for width in (rows.width, rows.back_width):
        assert 2 * width * capacity >= EXCHANGE_MIN_BYTES
        for cap in EXCHANGE_MAX_BLOCKS:
            per_peer = max(_torch_nblocks(2 * width * capacity, world, cap) // world, 1)
            assert (peer_rows * 2 * width) % per_peer == 0
