"""`deepep-ll`: DeepEP's low-latency kernels (`Buffer(low_latency_mode=True)`, `low_latency_dispatch` /
`low_latency_combine`), which need a deep_ep built with NVSHMEM.

Their own workload defaults (tests/test_low_latency.py: 128 tokens per rank, hidden 7168, topk 8) are the
class attribute `default_workload` (capability DefaultWorkload), below the suite's values.

The kernels' layout differs from moelab's contract: dispatch delivers one row per (token, local expert) in
`[local experts, ranks x max tokens, hidden]`, and combine reduces WITH the source's top-k weights. The
adapter: dispatch exposes one row per (token, this rank) (the first slot holding it; local ids and weights
from the routing gathered once per routing, since the kernels do not carry weights); combine writes each
row into every slot of its token and calls `low_latency_combine` with weights 1 on one of the token's
experts per destination rank and 0 on the others, so the source sums one row per rank, as the contract
says. The adapter work is made once per (input, handle) and reused while the worker repeats a call with the
same tensors, so the timed dispatch and combine are the library's calls; the pair op includes the combine
adapter (each dispatch's slots differ). fp8: the kernels cast inside dispatch (`use_fp8=True`), which is
DeepEP's own definition; scales come back per-128 float32 (`round_scale=False`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from moelab.backends import deepep_common as common
from moelab.backends.base import Backend, BackendContext, CaseConfig, Dispatched, Placement
from moelab.backends.capabilities import ChainedPairs, DefaultWorkload, RecvHook
from moelab.backends.deepep_own_tests import LOW_LATENCY_TEST
from moelab.backends.deepep_rules import v1_low_latency_reason
from moelab.backends.input_cache import InputCache
from moelab.backends.library_test import LibraryTest
from moelab.core.errors import BackendUnavailable


@dataclass(slots=True)
class LLHandle:
    lib: tuple[Any, ...]  # (src_info, layout_range, max tokens, hidden, num_experts)
    slot_row: torch.Tensor  # [valid slots] exposed row of each valid flat slot
    slot_idx: torch.Tensor  # [valid slots] flat slot index into [E_local * ranks * max tokens]
    topk_idx: torch.Tensor  # the source's routing
    unit_weights: torch.Tensor  # [T, K] 1 on one expert per destination rank, else 0


def unit_weights(topk_idx: torch.Tensor, experts_per_rank: int) -> torch.Tensor:
    """1.0 at the first of each token's experts on every destination rank, 0 elsewhere (and at -1)."""
    dest = torch.where(topk_idx >= 0, topk_idx // experts_per_rank, -1)
    k = topk_idx.shape[1]
    earlier_same = (dest.unsqueeze(2) == dest.unsqueeze(1)) & torch.ones(
        k, k, dtype=torch.bool, device=dest.device
    ).tril(-1)
    first = ~earlier_same.any(dim=2) & (dest >= 0)
    return first.float()


def slot_sources(
    layout_range: torch.Tensor, src_info: torch.Tensor, slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(source rank, valid) of each slot [E_local, slots] from layout_range[e, r] = begin << 32 | count."""
    begin = (layout_range >> 32).unsqueeze(2)  # [E, W, 1]
    count = (layout_range & 0xFFFFFFFF).unsqueeze(2)
    s = torch.arange(slots, device=layout_range.device).view(1, 1, -1)
    inside = (s >= begin) & (s < begin + count)  # [E, W, S]
    return inside.int().argmax(dim=1), inside.any(dim=1)


class DeepEPLowLatencyBackend(Backend, DefaultWorkload, ChainedPairs, RecvHook):
    name = "deepep-ll"
    dispatch_family = "low_latency"
    dispatch_family_source = (
        "DeepEP README 'Low-latency kernels with pure RDMA': one message per (token, expert) straight to its "
        "rank; tests/test_low_latency.py counts (hidden + scales + 16) bytes per selection"
    )
    description = "DeepEP low-latency kernels (NVSHMEM; IBGDA across nodes, NVLink P2P within one)"
    payload_dtypes = ("bf16", "fp8")
    sm_control = None
    default_workload: ClassVar[Mapping[str, Any]] = {"tokens_per_rank": 128, "hidden": 7168, "topk": 8}
    library_test: ClassVar[LibraryTest | None] = LOW_LATENCY_TEST

    @classmethod
    def availability(cls) -> str | None:
        if common.find_spec_origin("deep_ep") is None:
            return f"deep_ep not installed ({common.BUILD_HINT})"
        reason = common.cuda_reason()
        if reason:
            return reason
        deep_ep, reason = common.import_deep_ep()
        if deep_ep is None:
            return reason
        if common.api_of(deep_ep) == "v2":
            return "deep_ep is V2: its low-latency path lives in ElasticBuffer; moelab's deepep-ll drives V1 Buffer (tag v1.2.1)"
        import deep_ep_cpp  # noqa: PLC0415 - imported by deep_ep above already

        if not hasattr(deep_ep_cpp, "get_low_latency_rdma_size_hint"):
            return "no NVSHMEM in this deep_ep build (low-latency kernels need it): rebuild with NVSHMEM_DIR set or the nvidia-nvshmem wheel installed"
        return None

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        deep_ep, reason = common.import_deep_ep()
        if deep_ep is None:
            raise BackendUnavailable(reason or "deep_ep unavailable")
        self._ep = deep_ep
        runnable = [c for c in cases if self.unsupported_reason(c) is None]
        self.max_tokens = max((c.workload.tokens_per_rank for c in runnable), default=1)
        num_rdma, max_experts = 0, 1
        for c in runnable:
            experts = c.workload.num_experts(ctx.world)
            max_experts = max(max_experts, experts)
            num_rdma = max(
                num_rdma,
                int(
                    deep_ep.Buffer.get_low_latency_rdma_size_hint(
                        self.max_tokens, c.workload.hidden, ctx.world, experts
                    )
                ),
            )
        self.num_rdma_bytes = num_rdma
        # tests/test_low_latency.py: num_qps_per_rank = num_experts // num_ranks
        self._buffer = deep_ep.Buffer(
            ctx.group,
            num_rdma_bytes=num_rdma,
            low_latency_mode=True,
            num_qps_per_rank=max(1, max_experts // ctx.world),
            explicitly_destroy=True,
        )
        self._case: CaseConfig | None = None
        self._routing_cache = InputCache()
        self._dispatch_cache = InputCache()
        self._combine_cache = InputCache()
        self._combine_in: torch.Tensor | None = None

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        reason = super().planned_reason(case, where)
        if reason:
            return reason
        return v1_low_latency_reason(common.shape_of(where, case))

    def prepare(self, case: CaseConfig) -> None:
        if self._case is not None and (self._case.workload.hidden, self._case.workload.experts_per_rank) != (
            case.workload.hidden,
            case.workload.experts_per_rank,
        ):
            self._buffer.clean_low_latency_buffer(
                self.max_tokens, self._case.workload.hidden, self._case.workload.num_experts(self.ctx.world)
            )
        self._case = case
        for cache in (self._routing_cache, self._dispatch_cache, self._combine_cache):
            cache.clear()

    def _gathered_routing(
        self, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All ranks' routing [W, T, K] (the weights do not travel with the low-latency dispatch)."""
        world = self.ctx.world
        idx = torch.empty((world, *topk_idx.shape), dtype=topk_idx.dtype, device=topk_idx.device)
        w = torch.empty((world, *topk_weights.shape), dtype=topk_weights.dtype, device=topk_weights.device)
        dist.all_gather_into_tensor(idx, topk_idx.contiguous(), group=self.ctx.group)
        dist.all_gather_into_tensor(w, topk_weights.contiguous(), group=self.ctx.group)
        return idx, w

    def _expose(
        self, recv: Any, lib_handle: tuple[Any, ...], topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Dispatched:
        assert self._case is not None
        wl, rank = self._case.workload, self.ctx.rank
        epr, num_tokens = wl.experts_per_rank, wl.tokens_per_rank
        all_idx, all_w = self._routing_cache.get(
            [topk_idx, topk_weights], lambda: self._gathered_routing(topk_idx, topk_weights)
        )
        src_info, layout_range = lib_handle[0], lib_handle[1]
        slots = src_info.shape[1]
        src_rank, valid = slot_sources(layout_range, src_info, slots)
        key = (src_rank * num_tokens + src_info.long()).reshape(-1)
        flat_valid = valid.reshape(-1)
        slot_idx = torch.nonzero(flat_valid).squeeze(1)
        slot_key = key[slot_idx]
        uniq, inverse = torch.unique(slot_key, return_inverse=True)  # sorted (source rank, token) keys
        first_slot = torch.full((uniq.numel(),), -1, dtype=torch.long, device=key.device).scatter_reduce(
            0, inverse, slot_idx, reduce="amax", include_self=True
        )
        data, scales = recv if isinstance(recv, tuple) else (recv, None)
        recv_x = data.reshape(-1, data.shape[-1])[first_slot]
        recv_scales = None if scales is None else scales.reshape(-1, scales.shape[-1])[first_slot].float()
        src, tok = uniq // num_tokens, uniq % num_tokens
        idx = all_idx[src, tok]
        on_me = (idx >= rank * epr) & (idx < (rank + 1) * epr)
        ids = torch.where(on_me, idx - rank * epr, -1)
        weights = torch.where(on_me, all_w[src, tok], 0.0)
        handle = LLHandle(
            lib=lib_handle,
            slot_row=inverse,
            slot_idx=slot_idx,
            topk_idx=topk_idx,
            unit_weights=unit_weights(topk_idx, epr),
        )
        return Dispatched(
            recv_x=recv_x,
            recv_topk_idx=ids,
            recv_topk_weights=weights,
            handle=handle,
            recv_scales=recv_scales,
        )

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        """One low-latency dispatch: no separate layout step (phases = False), so `layout` is unused."""
        recv, _, lib_handle, _, _ = self._ll_dispatch(x, topk_idx, hook=False)
        return self._received(recv, lib_handle, x, topk_idx, topk_weights)

    def _ll_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, hook: bool) -> tuple[Any, ...]:
        assert self._case is not None
        wl = self._case.workload
        return self._buffer.low_latency_dispatch(  # type: ignore[no-any-return]
            x,
            topk_idx,
            self.max_tokens,
            wl.num_experts(self.ctx.world),
            use_fp8=wl.dtype == "fp8",
            round_scale=False,
            use_ue8m0=False,
            return_recv_hook=hook,
        )

    def dispatch_hooked(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Callable[[], Dispatched]:
        """RecvHook: the send kernel now (`return_recv_hook=True`: it returns once the data is issued,
        holding no SM while it travels); the hook launches the receive and exposes the rows."""
        recv, _, lib_handle, _, hook = self._ll_dispatch(x, topk_idx, hook=True)

        def receive() -> Dispatched:
            hook()
            return self._received(recv, lib_handle, x, topk_idx, topk_weights)

        return receive

    def _received(
        self, recv: Any, lib_handle: Any, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Dispatched:
        misses = self._dispatch_cache.misses
        exposed: Dispatched = self._dispatch_cache.get(
            [x, topk_idx, topk_weights], lambda: self._expose(recv, lib_handle, topk_idx, topk_weights)
        )
        if (
            self._dispatch_cache.misses == misses
        ):  # a repeat of the same inputs: the adapter's rows are those of the first call
            assert isinstance(exposed.handle, LLHandle)
            handle = exposed.handle
            return Dispatched(
                recv_x=exposed.recv_x,
                recv_topk_idx=exposed.recv_topk_idx,
                recv_topk_weights=exposed.recv_topk_weights,
                handle=LLHandle(
                    lib=lib_handle,
                    slot_row=handle.slot_row,
                    slot_idx=handle.slot_idx,
                    topk_idx=handle.topk_idx,
                    unit_weights=handle.unit_weights,
                ),
                recv_scales=exposed.recv_scales,
            )
        return exposed

    def combine(self, expert_out: torch.Tensor, handle: LLHandle) -> torch.Tensor:
        assert self._case is not None
        wl = self._case.workload
        lib = handle.lib
        shape = (lib[0].shape[0], lib[0].shape[1], expert_out.shape[1])

        def packed() -> torch.Tensor:
            # the slots of a repeated dispatch differ: recompute them from this handle
            src_rank, valid = slot_sources(lib[1], lib[0], shape[1])
            flat = torch.nonzero(valid.reshape(-1)).squeeze(1)
            key = (src_rank * wl.tokens_per_rank + lib[0].long()).reshape(-1)[flat]
            rows = torch.searchsorted(
                torch.unique(key), key
            )  # exposed rows are in sorted (source rank, token) order
            buf = torch.empty(shape, dtype=torch.bfloat16, device=expert_out.device)
            buf.view(-1, shape[2])[flat] = expert_out[rows]
            return buf

        x = self._combine_cache.get([expert_out, lib[0], lib[1]], packed)
        combined, _, _ = self._buffer.low_latency_combine(x, handle.topk_idx, handle.unit_weights, lib)
        return combined  # type: ignore[no-any-return]

    def close(self) -> None:
        buf, self._buffer = self._buffer, None
        if buf is not None:
            torch.cuda.synchronize()
            buf.destroy()

    def host_sync_ops(self) -> dict[str, str]:
        return {}  # none in the library calls; the adapter gathers the routing once, in the untimed check

    def library_versions(self) -> dict[str, str]:
        out = common.deep_ep_versions(self._ep, common.api_of(self._ep))
        out["torch"] = torch.__version__
        return out

    def record(self, case: CaseConfig) -> dict[str, Any]:
        return {
            "api": "V1 Buffer low_latency_dispatch/low_latency_combine",
            "num_max_dispatch_tokens_per_rank": self.max_tokens,
            "num_rdma_bytes": self.num_rdma_bytes,
            "use_fp8": case.workload.dtype == "fp8",
            "fp8_cast": "inside the dispatch kernel" if case.workload.dtype == "fp8" else None,
            "library_figure": "deepep_ll: (hidden + hidden/128*4 + 16) fp8 / hidden*2 bf16 bytes per (token, expert) selection (tests/test_low_latency.py)",
        }
