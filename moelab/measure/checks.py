"""Correctness of one backend's dispatch and combine against the reference (moelab.measure.reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moelab.backends.base import Dispatched
from moelab.backends.padded import pad_rows, received_rows
from moelab.core.routing import Routing
from moelab.core.workload import Workload
from moelab.measure.reference import (
    COMBINE_TOL,
    DISPATCH_TOL,
    ExpectedDispatch,
    decode_identity,
    expert_output,
    make_tokens,
    reference_combine,
    relative_error,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatchCheck:
    ok: bool
    error: float
    message: str
    order: torch.Tensor | None  # permutation putting received rows into (source rank, token) order
    ref_rows: torch.Tensor | None  # reference bf16 rows in the backend's received order


def _dense_weights(idx: torch.Tensor, weights: torch.Tensor, experts_per_rank: int) -> torch.Tensor:
    idx = idx.cpu().to(torch.int64)
    valid = idx >= 0
    dense = torch.zeros(idx.shape[0], experts_per_rank, dtype=torch.float64)
    dense.scatter_add_(1, torch.where(valid, idx, 0), torch.where(valid, weights.cpu().double(), 0.0))
    return dense


def _failed(message: str, error: float = float("inf")) -> DispatchCheck:
    return DispatchCheck(ok=False, error=error, message=message, order=None, ref_rows=None)


def check_dispatch(
    d: Dispatched, expected: ExpectedDispatch, workload: Workload, world: int
) -> DispatchCheck:
    d = received_rows(d)  # a padded result (row count on the GPU) is read here, outside any timed region
    if d.num_rows != expected.num_rows:
        return _failed(f"received {d.num_rows} rows, expected {expected.num_rows}")
    recv = d.recv_x_float()  # stays on its device: the error is computed there
    src, tok, exact = decode_identity(recv)
    if not exact:
        return _failed("received rows carry no valid token identity (payload corrupted)")
    num_tokens = workload.tokens_per_rank
    keys = src * num_tokens + tok
    expected_keys = expected.src_rank * num_tokens + expected.src_token
    order = torch.argsort(keys)
    if not torch.equal(keys[order], expected_keys):
        missing = len(set(expected_keys.tolist()) - set(keys.tolist()))
        return _failed(f"wrong set of received tokens ({missing} expected tokens missing or duplicated)")
    ref_sorted = _reference_rows(expected, workload, world)
    err = relative_error(recv[order.to(recv.device)], ref_sorted)
    tol = DISPATCH_TOL.get(workload.dtype, 0.0)
    if not err <= tol:
        return _failed(f"payload error {err:.3g} > {tol:g}", err)
    got_w = _dense_weights(
        d.recv_topk_idx[order.to(d.recv_topk_idx.device)],
        d.recv_topk_weights[order.to(d.recv_topk_weights.device)],
        workload.experts_per_rank,
    )
    want_w = _dense_weights(expected.topk_idx_local, expected.topk_weights, workload.experts_per_rank)
    if not torch.allclose(got_w, want_w, rtol=1e-6, atol=1e-7):
        return _failed("received expert ids or weights differ from the routing", err)
    ref_in_recv_order = torch.empty_like(ref_sorted)
    ref_in_recv_order[order] = ref_sorted
    return DispatchCheck(ok=True, error=err, message="ok", order=order, ref_rows=ref_in_recv_order)


def _reference_rows(expected: ExpectedDispatch, workload: Workload, world: int) -> torch.Tensor:
    """The rows this rank should receive, in (source rank, token) order, regenerated from each source's seed."""
    ref_sorted = torch.empty(expected.num_rows, workload.hidden, dtype=torch.bfloat16)
    for s in range(world):
        sel = torch.nonzero(expected.src_rank == s).squeeze(1)
        if sel.numel():
            ref_sorted[sel] = make_tokens(workload, s)[expected.src_token[sel]]
    return ref_sorted


def expert_out_for(d: Dispatched, ref_rows: torch.Tensor, rank: int, experts_per_rank: int) -> torch.Tensor:
    """Combine's input: the reference rows through this rank's stand-in experts, in received order.

    Built from the exact reference rows, so the combine check does not inherit dispatch's quantization.
    A padded dispatch (moelab.backends.padded) gets zero rows up to its capacity, the shape its combine takes.
    """
    got = received_rows(d)
    rows = expert_output(
        ref_rows, got.recv_topk_idx.cpu(), got.recv_topk_weights.cpu(), rank, experts_per_rank
    )
    return pad_rows(rows, d)


def check_combine(
    out: torch.Tensor, x_own: torch.Tensor, routing: Routing, combine_dtype: str
) -> tuple[bool, float, str]:
    ref = reference_combine(x_own, routing)
    if tuple(out.shape) != tuple(ref.shape):
        return False, float("inf"), f"combine returned shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    err = relative_error(out.float(), ref)
    tol = COMBINE_TOL.get(combine_dtype, COMBINE_TOL["bf16"])
    return (err <= tol), err, ("ok" if err <= tol else f"combine error {err:.3g} > {tol:g}")
