"""What a backend may do beyond dispatch and combine, each a protocol checked by type (isinstance on the
backend, or on its class for what a class declares): a built-in says so by subclassing the protocol, a
plugin may subclass it too or just have its members.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from moelab.core.case_record import Figure
from moelab.core.rows import RankRows


@runtime_checkable
class DefaultWorkload(Protocol):
    """Workload values this backend's kernels are built for (e.g. the low-latency kernels' own sizes): the
    planner puts them below the suite's values, so a suite or a flag still sets them."""

    default_workload: ClassVar[Mapping[str, Any]]


@runtime_checkable
class DispatchAlongHandle(Protocol):
    """Sends rows along an earlier dispatch's handle: the backward of combine in the e2e layer."""

    def dispatch_with_handle(self, rows: torch.Tensor, handle: Any) -> torch.Tensor:
        """One row per source token (`rows` [T, H], e.g. the gradient of combine's output) to where the
        dispatch of `handle` sent that token: [R, H] in that dispatch's received order."""
        ...


@runtime_checkable
class HandleDispatchReason(Protocol):
    """A backend with DispatchAlongHandle that cannot use it in some cases says why (asked after prepare)."""

    def dispatch_with_handle_reason(self) -> str | None:
        """Why the prepared case cannot send rows along a handle, or None (it can)."""
        ...


@runtime_checkable
class ReusedReceiveBuffer(Protocol):
    """Dispatch returns the received rows (and their routing) as views of one receive buffer that the next
    dispatch overwrites, so two dispatches cannot be in flight at once: an overlapped schedule of the e2e
    layer (two or more micro-batches dispatched before the first is consumed) would compute on the second's
    rows. `reused_receive_buffer` says where the buffer lives (for the reason the layer gives)."""

    reused_receive_buffer: ClassVar[str]


@runtime_checkable
class MaskedRouting(Protocol):
    """Dispatch takes -1 entries in topk_idx (no expert: the token goes nowhere for that slot; a token with
    no expert left is sent nowhere) and combine gives zeros for a token sent nowhere. The e2e layer's
    expert-chunked schedule dispatches one group of experts at a time this way. `masked_routing` says how
    the library treats the -1 entries (for the record)."""

    masked_routing: ClassVar[str]


@runtime_checkable
class ColumnCombine(Protocol):
    """Combine, and dispatch_with_handle (its backward), take rows narrower than those dispatched: a slice of
    the hidden columns, sent along the same handle. The e2e layer's column-pipelined schedule (mode
    columns) combines the expert output a column slice at a time, each slice's combine under the next
    slice's GEMM. `column_unit`: the columns every slice's width is a multiple of (the row alignment or the
    quantization block); 0 declares none (a subclass that has not been checked)."""

    column_unit: ClassVar[int]


@runtime_checkable
class ZeroSmComm(Protocol):
    """The backend can move the payload on no SM (a copy-engine path): the e2e layer's `comm = zero-sm`."""

    @classmethod
    def zero_sm_reason(cls, comm_backend: str) -> str | None:
        """Why this build cannot run the zero-SM path over `comm_backend` ("nccl" or "gloo"), or None. Cheap
        and kernel-free: asked when the case is planned and again on each rank before it is prepared."""
        ...

    def zero_sm_setting(self) -> str:
        """Move the prepared case onto the zero-SM path (called after prepare, before any timed call);
        returns what it runs, for the record."""
        ...


@runtime_checkable
class RecvHook(Protocol):
    """Dispatch in two halves: the send is launched now and returns a hook; calling the hook launches the
    receive and gives what dispatch gives. Between the two no kernel of the dispatch holds an SM
    (DeepEP's low-latency `return_recv_hook=True`), so the GEMMs launched in between get the whole GPU."""

    def dispatch_hooked(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Callable[[], Any]:
        """Launch the send of `x` and return the receive hook, which returns a moelab Dispatched."""
        ...


@dataclass(frozen=True, slots=True)
class PartLayouts:
    """The layouts of an overlapped layer's parts, and each part's per-local-expert pair counts, known on
    the host from one exchange and one host read (BatchedLayout.layouts)."""

    handles: list[Any]  # one per part, each what dispatch(..., layout=...) takes
    pair_counts: list[tuple[int, ...]]  # per part, each local expert's received (token, slot) pairs


@runtime_checkable
class BatchedLayout(Protocol):
    """Lays out several routings (the parts of an overlapped e2e layer) with one count exchange and one
    host read for all of them, and returns from the same read each part's pair counts. Without it each
    part's layout syncs the host once and the pair counts take an all-reduce and a read of their own, all
    before the first payload: on a host-bound layer that front is what the overlap loses."""

    def layouts(self, routings: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> PartLayouts | None:
        """Each (topk_idx, topk_weights)'s layout and pair counts, or None where the prepared case has no
        count exchange to fold them into (then each part is laid out on its own)."""
        ...


@runtime_checkable
class HostExpertCounts(Protocol):
    """The fresh dispatch reports each local expert's received pairs on the host
    (Dispatched.recv_expert_counts), read in the host sync that dispatch makes anyway (DeepEP V1's
    num_recv_tokens_per_expert_list): the e2e layer's grouping then needs no count of its own."""

    def expert_counts_on_host(self) -> bool:
        """Whether the prepared case's fresh dispatch fills Dispatched.recv_expert_counts."""
        ...


@runtime_checkable
class LibraryFigures(Protocol):
    """The figures the library's own test prints, computed its way, for the ops that test times
    (`library_ops`, timed as it times them: back-to-back calls after one L2 flush). Only the path the
    library's test times may carry the library's name."""

    library_ops: ClassVar[tuple[str, ...]]

    @classmethod
    def library_figures(
        cls, op: str, rows: Sequence[RankRows], bytes_per_row: int, samples_us: Sequence[Sequence[float]]
    ) -> list[Figure]: ...


class _Timed(Protocol):
    def splits_phases(self) -> bool: ...

    def host_sync_ops(self) -> dict[str, str]: ...


def pair_sync_reason(backend: _Timed) -> str | None:
    """Why a backend's pair (its dispatch along a known layout, or whole, then its combine) cannot be
    chained: the host syncs its own host_sync_ops name on those calls. None when it holds none."""
    dispatch = "dispatch" if backend.splits_phases() else "dispatch_fresh"
    syncs = backend.host_sync_ops()
    held = [f"{op}: {syncs[op]}" for op in (dispatch, "combine") if op in syncs]
    return f"the pair would synchronise the host ({'; '.join(held)})" if held else None


@runtime_checkable
class ChainedPairs(Protocol):
    """Dispatch then combine can be chained back to back, K pairs per timed iteration with no host
    synchronisation between or inside them: the `pair` op (moelab.core.ops), CollectiveX's pair period.
    A backend declares it where its API allows it (no sizes read back to the host on that path); the
    prepared case may still say why it cannot (a knob that puts a host sync on the path)."""

    def chained_pairs_reason(self) -> str | None:
        """Why the prepared case cannot chain pairs, or None. By default: the host syncs the backend's
        host_sync_ops names on the pair's calls."""
        return pair_sync_reason(self)  # type: ignore[arg-type]


def chains_pairs(backend: object) -> bool:
    """Whether the prepared case of `backend` times the pair op."""
    return isinstance(backend, ChainedPairs) and backend.chained_pairs_reason() is None


def library_figures(
    backend: object,
    op: str,
    rows: Sequence[RankRows],
    bytes_per_row: int,
    samples_us: Sequence[Sequence[float]],
) -> list[Figure]:
    """The own-test figures of `op` of `backend` (a backend or its class): none where it computes none."""
    if not isinstance(backend, LibraryFigures):
        return []
    owner = backend if isinstance(backend, type) else type(backend)
    return owner.library_figures(op, rows, bytes_per_row, samples_us)
