"""Hybrid-EP's handle, read by name: the tuple `HybridEPBuffer.dispatch` returns and takes back (and the
longer one of `dispatch_with_permute`), field for field as deep_ep/hybrid_ep_buffer.py (branch hybrid-ep)
packs it from its `hybrid_ep_cpp.HandleImpl`.

Each view is a NamedTuple, so it is the tuple the library unpacks, with no copy; making one from the
library's tuple checks its length. `handle_fields_reason` checks once per process that the build's
HandleImpl has every field the views name (a build whose handle changed is refused with that reason
rather than read wrong).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class PlainHandle(NamedTuple):
    """The handle of the plain path (`dispatch` / `combine`)."""

    sparse_to_dense_map: torch.Tensor
    rdma_to_attn_map: torch.Tensor
    attn_to_rdma_map: torch.Tensor
    num_dispatched_tokens_tensor: torch.Tensor  # pinned host memory: rows received, after dispatch's sync
    local_expert_routing_map: torch.Tensor  # [rows, experts per rank] bool
    num_of_tokens_per_rank: int
    config: Any

    @classmethod
    def of(cls, lib: tuple[Any, ...]) -> PlainHandle:
        return cls._make(_sized(cls, lib))

    @classmethod
    def of_impl(cls, impl: Any) -> PlainHandle:
        """From a HandleImpl (runtime.metadata_preprocessing's), as HybridEPBuffer.dispatch packs it."""
        return cls._make(getattr(impl, name) for name in cls._fields)


class PermuteHandle(NamedTuple):
    """The handle of the permute paths (`dispatch_with_permute` / `combine_with_unpermute`)."""

    sparse_to_dense_map: torch.Tensor
    rdma_to_attn_map: torch.Tensor
    attn_to_rdma_map: torch.Tensor
    num_dispatched_tokens_tensor: torch.Tensor
    local_expert_routing_map: torch.Tensor
    dense_chunk_layout: torch.Tensor
    dense_to_expert_map: torch.Tensor  # [rows, experts per rank]: permuted row of each (token, expert), -1
    tokens_per_expert: torch.Tensor
    num_of_tokens_per_rank: int
    config: Any
    overflow_flag: torch.Tensor

    @classmethod
    def of(cls, lib: tuple[Any, ...]) -> PermuteHandle:
        return cls._make(_sized(cls, lib))

    def num_dispatched(self) -> int:
        """Rows this rank received (read from pinned host memory, valid after dispatch's host sync)."""
        return int(self.num_dispatched_tokens_tensor.reshape(-1)[0].item())


def _sized(view: type[tuple[Any, ...]], lib: tuple[Any, ...]) -> tuple[Any, ...]:
    fields = view._fields  # type: ignore[attr-defined]
    if len(lib) != len(fields):
        raise TypeError(
            f"Hybrid-EP handle of {len(lib)} fields where moelab reads {len(fields)} ({', '.join(fields)}): "
            "a build moelab does not know"
        )
    return lib


def handle_fields_reason(handle_impl: Any) -> str | None:
    """Why this build's HandleImpl cannot be read through the views (fields they name that it lacks), or
    None. `handle_impl`: an instance of hybrid_ep_cpp.HandleImpl."""
    named = dict.fromkeys(PlainHandle._fields + PermuteHandle._fields)
    missing = [name for name in named if not hasattr(handle_impl, name)]
    if missing:
        return f"this Hybrid-EP build's handle has no {', '.join(missing)} (moelab reads the branch hybrid-ep handle)"
    return None
