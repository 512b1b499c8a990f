"""`nccl-ep`: NVIDIA NCCL EP (PyPI `nccl-extensions`, `import nccl.ep`), high-throughput algorithm (hierarchical:
NVLink aggregation inside a node, RDMA between nodes), flat output layout.

NCCL EP runs on its own NCCL communicator (nccl4py's, made from the job's process group) and needs a
libnccl of at least 2.30.7, newer than the one torch wheels ship (2.28.x): install `nvidia-nccl-cu13==2.30.7`
and make sure that is the libnccl the process loads (availability says which one it found), with NCCL_HOME
naming its install: nccl.ep JIT-compiles its kernels against $NCCL_HOME/include at first use.

layout: `Handle.update(topk_idx)` (the handle is created on the first layout of a case), NCCL EP's
metadata exchange; it writes the received row count into a device counter.
dispatch: `Handle.dispatch` of BF16 tokens and float32 weights into buffers sized for the worst case
(`max_recv_tokens_per_rank` = tokens x world: static sizes, no host sync, CUDA-graph capturable); the
received count stays on the device (moelab.backends.padded.PaddedDispatched), ids are local (-1 elsewhere).
combine: `Handle.combine` of one pre-reduced row per received row (flat layout) back to [tokens, hidden].
--sms maps to `GroupConfig.max_num_sms`, set when an EP group is created: one group per SM count.
The handle is one per group: a layout is valid until the next layout of another routing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from moelab.backends.base import Backend, BackendContext, CaseConfig, Placement
from moelab.backends.capabilities import ChainedPairs
from moelab.backends.padded import PaddedDispatched

MIN_NCCL = (2, 30, 7)
PACKAGE = "nccl-extensions==0.1.0"


def parse_version(text: str) -> tuple[int, ...]:
    """'2.30.7' (or '2.30.7+cuda13.0') -> (2, 30, 7)."""
    core = text.split("+", 1)[0]
    return tuple(int(p) for p in core.split(".") if p.isdigit())


def nccl_version_problem(
    found: tuple[int, ...] | None, path: str | None, torch_nccl: str | None
) -> str | None:
    """None when `found` is new enough for NCCL EP, else the one-line reason."""
    need = ".".join(map(str, MIN_NCCL))
    where = f" at {path}" if path else ""
    torch_part = f"; torch's NCCL is {torch_nccl}" if torch_nccl else ""
    if found is None:
        return f"nccl.ep loaded but nccl4py found no libnccl (NCCL EP needs >= {need}){torch_part}"
    if tuple(found) < MIN_NCCL:
        have = ".".join(map(str, found))
        return (
            f"NCCL {have}{where} is too old: NCCL EP needs >= {need} "
            f"(pip install nvidia-nccl-cu13==2.30.7 and load its libnccl.so.2){torch_part}"
        )
    return None


_HEADER_FIELD = re.compile(r"^#define NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)", re.MULTILINE)


def header_version(text: str) -> tuple[int, int, int] | None:
    """NCCL_MAJOR/MINOR/PATCH of an nccl.h, or None where one is missing."""
    fields = dict(_HEADER_FIELD.findall(text))
    if not {"MAJOR", "MINOR", "PATCH"} <= fields.keys():
        return None
    return int(fields["MAJOR"]), int(fields["MINOR"]), int(fields["PATCH"])


def jit_headers_problem(home: str | None, lib: tuple[int, ...]) -> str | None:
    """NCCL EP compiles its kernels at first use against $NCCL_HOME/include, which `import nccl.ep` defaults to
    the nvidia-nccl wheel's headers (the image's 2.28.x) even where a newer libnccl is the one loaded; kernels
    built against other headers than the loaded libnccl's fail to compile or disagree with it."""
    header = Path(home) / "include" / "nccl.h" if home else None
    if header is None or not header.is_file():
        return None
    found = header_version(header.read_text(errors="replace"))
    if found is None or found[:2] == tuple(lib[:2]):
        return None
    have, want = ".".join(map(str, found)), ".".join(map(str, lib))
    return (
        f"nccl.ep compiles its kernels against NCCL {have} headers ({header}) but the loaded libnccl is {want}: "
        "set NCCL_HOME to that libnccl's own install (its include/ and lib/) before starting"
    )


def _torch_nccl_version() -> str | None:
    try:
        if torch.cuda.is_available() and torch.cuda.nccl.is_available([]):  # type: ignore[no-untyped-call]
            return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        return None
    return None


def _nccl_ep_problem() -> str | None:
    try:
        import nccl.ep  # noqa: F401
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if missing in ("nccl", "nccl.ep"):
            return f"nccl-extensions not installed (pip install {PACKAGE}): {exc}"
        return f"import nccl.ep failed: {type(exc).__name__}: {exc}"
    except Exception as exc:  # the bindings raise RuntimeError for a cuda.bindings mismatch
        return f"import nccl.ep failed: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA GPU (NCCL EP runs on CUDA devices)"
    try:
        import nccl.core

        lib = nccl.core.get_version().libnccl
    except Exception as exc:
        return f"nccl4py cannot report its libnccl: {type(exc).__name__}: {exc}"
    found = parse_version(str(lib.version)) if lib is not None else None
    path = str(lib.path) if lib is not None and lib.path is not None else None
    problem = nccl_version_problem(found, path, _torch_nccl_version())
    if problem is None and found is not None:  # nccl.ep set NCCL_HOME at import where it was unset
        problem = jit_headers_problem(os.environ.get("NCCL_HOME"), found)
    return problem


@dataclass(frozen=True, slots=True)
class GroupKey:
    sms: int | None
    tokens: int
    hidden: int
    topk: int
    experts_per_rank: int


@dataclass(slots=True)
class EpGroupState:
    """One NCCL EP group with its static receive buffers and (after the first layout) its handle."""

    group: Any  # nccl.ep.Group
    handle: Any | None
    recv_x: torch.Tensor  # [tokens * world, hidden] bf16
    recv_w: torch.Tensor  # [tokens * world, topk] float32
    recv_idx: torch.Tensor  # [tokens * world, topk] int64, local ids
    combined: torch.Tensor  # [tokens, hidden] bf16
    outputs: Any  # nccl.ep.DispatchOutputs over the buffers above
    combine_out: Any  # nccl.ep.CombineOutputs
    expert_in: torch.Tensor  # [tokens * world, hidden] bf16, used when combine gets fewer rows


@dataclass(frozen=True, slots=True)
class NcclEpLayout:
    state: EpGroupState
    recv_total: torch.Tensor  # [1] int32, written by the handle update
    topk_idx: torch.Tensor  # kept alive: the handle refers to it
    descriptors: tuple[Any, ...]  # the nccl.ep Tensor/LayoutInfo objects: their C structs hold raw pointers


def recv_counts_of(total: torch.Tensor, world: int) -> torch.Tensor:
    """A [world] count vector whose sum is `total` (PaddedDispatched wants per-source counts; NCCL EP's flat
    layout reports the total only)."""
    counts = torch.zeros(world, dtype=torch.int64, device=total.device)
    counts[0] = total.to(torch.int64).reshape(())
    return counts


class NcclEPBackend(Backend, ChainedPairs):
    name = "nccl-ep"
    dispatch_family = "hierarchical"  # its high-throughput mode, the one this backend runs
    dispatch_family_source = (
        "NVIDIA/nccl contrib/nccl_ep/README.md (63bd13e, 2026-06-05): 'HT mode implements hierarchical "
        "communication patterns, relying on NVLink for intra-node aggregation, and on RDMA for inter-node "
        "communication'; ep_bench counts RDMA bytes once per (token, node)"
    )
    description = "NVIDIA NCCL EP (nccl.ep) high-throughput dispatch/combine, flat layout"
    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control = "nccl.ep GroupConfig.max_num_sms, one EP group per SM count"
    phases: ClassVar[bool] = True

    @classmethod
    def availability(cls) -> str | None:
        return _nccl_ep_problem()

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        import nccl.ep as ep
        from nccl.ep.interop.torch import get_nccl_comm_from_group

        self._ep = ep
        self._comm = get_nccl_comm_from_group(ctx.group)
        self._states: dict[GroupKey, EpGroupState] = {}
        self._state: EpGroupState | None = None
        # descriptors are (pointer, shape, dtype) only, so one made for the same pointer and shape is reusable
        self._x_desc: tuple[tuple[int, tuple[int, ...]], Any, Any] | None = None
        self._combine_desc: tuple[tuple[int, tuple[int, ...]], Any] | None = None

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        if case.knobs:
            return f"{cls.name}: unknown knob(s) {', '.join(sorted(case.knobs))} (it has none)"
        if (case.workload.hidden * 2) % 16:
            return f"{cls.name}: NCCL EP high-throughput rows must be a multiple of 16 bytes (hidden {case.workload.hidden})"
        return super().planned_reason(case, where)

    def _stream(self) -> int:
        return int(torch.cuda.current_stream(self.ctx.device).cuda_stream)

    def prepare(self, case: CaseConfig) -> None:
        wl = case.workload
        key = GroupKey(case.sms, wl.tokens_per_rank, wl.hidden, wl.topk, wl.experts_per_rank)
        if key not in self._states:
            self._states[key] = self._make_group(key)
        self._state = self._states[key]

    def _make_group(self, key: GroupKey) -> EpGroupState:
        ep, world, dev = self._ep, self.ctx.world, self.ctx.device
        capacity = key.tokens * world
        config = ep.GroupConfig(
            algorithm=ep.Algorithm.HIGH_THROUGHPUT,
            num_experts=key.experts_per_rank * world,
            max_dispatch_tokens_per_rank=key.tokens,
            max_recv_tokens_per_rank=capacity,  # static: no host sync, graph-capturable
            max_token_bytes=key.hidden * 2,
            max_num_sms=key.sms or 0,
            num_topk=key.topk,
        )
        group = ep.Group.create(self._comm, config)
        recv_x = torch.empty(capacity, key.hidden, dtype=torch.bfloat16, device=dev)
        recv_w = torch.empty(capacity, key.topk, dtype=torch.float32, device=dev)
        recv_idx = torch.empty(capacity, key.topk, dtype=torch.int64, device=dev)
        combined = torch.empty(key.tokens, key.hidden, dtype=torch.bfloat16, device=dev)
        outputs = ep.DispatchOutputs(
            tokens=ep.Tensor(recv_x), topk_weights=ep.Tensor(recv_w), topk_idx=ep.Tensor(recv_idx)
        )
        return EpGroupState(
            group=group,
            handle=None,
            recv_x=recv_x,
            recv_w=recv_w,
            recv_idx=recv_idx,
            combined=combined,
            outputs=outputs,
            combine_out=ep.CombineOutputs(tokens=ep.Tensor(combined)),
            expert_in=torch.zeros(capacity, key.hidden, dtype=torch.bfloat16, device=dev),
        )

    def _current(self) -> EpGroupState:
        if self._state is None:
            raise RuntimeError(f"{self.name}: prepare(case) must run before dispatch")
        return self._state

    def host_sync_ops(self) -> dict[str, str]:
        return {}

    def host_sync_note(self) -> str:
        return "none (static receive buffers; the correctness check reads the row count once, untimed)"

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> NcclEpLayout:
        ep, state = self._ep, self._current()
        total = torch.zeros(1, dtype=torch.int32, device=topk_idx.device)
        info = ep.LayoutInfo(recv_total_counter=ep.Tensor(total), recv_topk_idx_kind=ep.ExpertIdKind.LOCAL)
        idx = ep.Tensor(topk_idx)
        if state.handle is None:
            state.handle = state.group.create_handle(
                ep.Layout.FLAT, idx, layout_info=info, stream=self._stream()
            )
        else:
            state.handle.update(idx, layout_info=info, stream=self._stream())
        return NcclEpLayout(state, total, topk_idx, (idx, info))

    def _x_descriptor(self, x: torch.Tensor, w: torch.Tensor) -> Any:
        key = (x.data_ptr(), tuple(x.shape))
        if self._x_desc is None or self._x_desc[0] != key or self._x_desc[1] is not w:
            inputs = self._ep.DispatchInputs(tokens=self._ep.Tensor(x), topk_weights=self._ep.Tensor(w))
            self._x_desc = (key, w, inputs)
        return self._x_desc[2]

    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        layout: NcclEpLayout | None = None,
    ) -> PaddedDispatched:
        lay = layout if layout is not None else self.layout(topk_idx, topk_weights)
        state = lay.state
        w = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
        assert state.handle is not None
        state.handle.dispatch(
            self._x_descriptor(x.contiguous(), w.contiguous()), state.outputs, stream=self._stream()
        )
        return PaddedDispatched(
            recv_x=state.recv_x,
            recv_topk_idx=state.recv_idx,
            recv_topk_weights=state.recv_w,
            handle=lay,
            recv_counts=recv_counts_of(lay.recv_total, self.ctx.world),
        )

    def combine(self, expert_out: torch.Tensor, handle: NcclEpLayout) -> torch.Tensor:
        state = handle.state
        rows = expert_out
        if rows.shape[0] != state.expert_in.shape[0] or not rows.is_contiguous():
            state.expert_in[: rows.shape[0]].copy_(rows)
            rows = state.expert_in
        assert state.handle is not None
        key = (rows.data_ptr(), tuple(rows.shape))
        if self._combine_desc is None or self._combine_desc[0] != key:
            self._combine_desc = (key, self._ep.CombineInputs(tokens=self._ep.Tensor(rows)))
        state.handle.combine(self._combine_desc[1], state.combine_out, stream=self._stream())
        return state.combined

    def close(self) -> None:
        for state in self._states.values():
            if state.handle is not None:
                state.handle.destroy()
            state.group.destroy()
        self._states.clear()
        self._state = None

    def library_versions(self) -> dict[str, str]:
        versions = {"torch": str(torch.__version__)}
        try:
            import nccl.core

            versions["nccl_ep"] = str(self._ep.get_lib_version())
            lib = nccl.core.get_version().libnccl
            if lib is not None:
                versions["nccl"] = str(lib.version)
        except Exception:
            pass
        return versions

    def record(self, case: CaseConfig) -> dict[str, Any]:
        return {
            "algorithm": "HIGH_THROUGHPUT",
            "layout": "FLAT",
            "max_num_sms": case.sms or 0,
            "max_recv_tokens_per_rank": case.workload.tokens_per_rank * self.ctx.world,
        }
