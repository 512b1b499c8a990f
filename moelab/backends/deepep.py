"""`deepep`: DeepEP's normal (high-throughput) kernels: V1 `deep_ep.Buffer` (get_dispatch_layout → dispatch →
combine; intranode over NVLink, internode over NVLink + RDMA), or V2 `deep_ep.ElasticBuffer` where the
installed deep_ep is V2 (main branch, `deep_ep.__version__` 2.x).

Phases (V1): `layout` is `Buffer.get_dispatch_layout` (per-rank/expert counts, is_token_in_rank);
`dispatch` with the handle of an earlier dispatch of the same routing is DeepEP's cached dispatch
(`dispatch(x, handle=..., config=...)`, payload only, no host wait): the path tests/test_intranode.py
times, so `deepep_nvl` is computed from it; `dispatch_fresh` is get_dispatch_layout + the non-cached
dispatch with top-k metadata, which waits on the host for the receive counts (notify_dispatch
busy-waits on a mapped counter). V2's ElasticBuffer has no separate layout call: it is timed whole.
fp8: DeepEP's test casts once (`per_token_cast_to_fp8`, 1x128 blocks, scales made column-major) and
passes the (x_fp8, scales) tuple into every timed dispatch, so the cast is outside its timing. Here the
cast is made once per input tensor (InputCache): knob `fp8_cast = "outside"` (default);
`fp8_cast = "inside"` casts in every call (what a model pays).
Combine: `Buffer.combine(x, handle, config)` without top-k weights: a plain sum at the source.

SMs: V1 passes `Config(sms, nvl_chunk, nvl_buffer, rdma_chunk, rdma_buffer)` to each call, the chunk
sizes taken from DeepEP's recommended configs (`Buffer.get_dispatch_config(world)` / `get_combine_config`)
unless a knob sets them; `sms = default` uses those configs at `Buffer.num_sms` (20). V2 passes `num_sms`.
Buffers: one `Buffer` per job, NVL/RDMA bytes the max of `Config.get_*_buffer_size_hint` over the cases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from moelab.backends import deepep_common as common
from moelab.backends.base import Backend, BackendContext, CaseConfig, Dispatched, Placement, SourceBuild
from moelab.backends.capabilities import (
    ChainedPairs,
    ColumnCombine,
    DispatchAlongHandle,
    HostExpertCounts,
    LibraryFigures,
    MaskedRouting,
)
from moelab.backends.deepep_own_tests import INTRANODE_TEST
from moelab.backends.deepep_rules import v1_normal_reason
from moelab.backends.input_cache import InputCache
from moelab.backends.knobs import Knobs, knob
from moelab.backends.library_test import LibraryTest
from moelab.backends.tuning import TuneSpace
from moelab.core.case_record import Figure
from moelab.core.errors import BackendUnavailable, SpecError
from moelab.core.rows import RankRows
from moelab.core.workload import Workload

CAST_MODES = ("outside", "inside")
DEFAULT_CONFIG_SMS = 20  # deep_ep.Buffer.num_sms at import (buffer.py:31)
# DeepEP v1.2.1 deep_ep/buffer.py:236-247 get_dispatch_config and :262-273 get_combine_config, mirrored because
# the Config binding exposes no fields to read back: ranks -> (nvl send chunk, nvl recv buffer, rdma send chunk, rdma recv buffer)
V1_DISPATCH_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (24, 256, 6, 128),
    4: (6, 256, 6, 128),
    8: (6, 256, 6, 128),
    16: (36, 288, 20, 128),
    24: (8, 288, 32, 128),
    32: (32, 288, 32, 128),
    64: (20, 288, 28, 128),
    128: (20, 560, 32, 128),
    144: (32, 720, 12, 128),
    160: (28, 720, 12, 128),
}
V1_COMBINE_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (10, 256, 6, 128),
    4: (9, 256, 6, 128),
    8: (4, 256, 6, 128),
    16: (4, 288, 12, 128),
    24: (1, 288, 8, 128),
    32: (1, 288, 8, 128),
    64: (1, 288, 20, 128),
    128: (1, 560, 12, 128),
    144: (2, 720, 8, 128),
    160: (2, 720, 8, 128),
}


@dataclass(frozen=True, kw_only=True)
class DeepEPKnobs(Knobs):
    owner = "deepep"  # uccl-ep, driven as deepep, shares them
    unknown_message = "{owner}: unknown knob(s) {unknown} (knobs: {declared})"
    fp8_cast: str = knob(
        "outside",
        "outside (default: cast once per input, as DeepEP's test) | inside (cast in every dispatch)",
        choices=CAST_MODES,
    )
    nvl_chunk: int | None = knob(
        None, "V1 Config NVL send chunk of dispatch (default: Buffer.get_dispatch_config)"
    )
    nvl_buffer: int | None = knob(None, "V1 Config NVL receive buffer (tokens)")
    rdma_chunk: int | None = knob(None, "V1 Config RDMA send chunk of dispatch")
    rdma_buffer: int | None = knob(None, "V1 Config RDMA receive buffer (tokens)")
    combine_nvl_chunk: int | None = knob(
        None, "V1 Config NVL send chunk of combine (default: Buffer.get_combine_config)"
    )
    combine_rdma_chunk: int | None = knob(None, "V1 Config RDMA send chunk of combine")


@dataclass(slots=True)
class DeepEPHandle:
    """What a dispatch leaves for the next dispatch of the same routing (cached) and for combine."""

    lib: Any  # the library's handle
    recv_topk_idx: torch.Tensor
    recv_topk_weights: torch.Tensor
    padded_rows: int | None = None  # V2: combine takes the padded layout dispatch returned


@dataclass(frozen=True, slots=True)
class DeepEPLayout:
    """V1's get_dispatch_layout outputs: the routing step before any payload moves."""

    per_rank: torch.Tensor
    per_rdma_rank: torch.Tensor | None
    per_expert: torch.Tensor
    in_rank: torch.Tensor


def expert_counts(per_expert: object, local_experts: int) -> tuple[int, ...] | None:
    """V1 dispatch's num_recv_tokens_per_expert_list (a Python list read in its own host sync: the received
    tokens per local expert, aligned to expert_alignment, 1 here) as the pair counts, where it is one."""
    if not isinstance(per_expert, list) or len(per_expert) != local_experts:
        return None
    return tuple(int(c) for c in per_expert)


class _V1Engine:
    """DeepEP V1 `Buffer`: get_dispatch_layout, then dispatch (fresh or cached), combine with a Config."""

    phases = True
    sync = "the host waits for the receive counts (notify_dispatch busy-waits on a mapped counter)"

    def __init__(self, backend: DeepEPBackend, cases: Sequence[CaseConfig]) -> None:
        self.b = backend
        self.buffer = backend._make_v1(cases)
        self.dispatch_cfg: Any = None
        self.combine_cfg: Any = None

    def prepare(self, case: CaseConfig) -> None:
        self.dispatch_cfg, self.combine_cfg = self.b._configs(case)

    def layout(self, topk_idx: torch.Tensor, num_experts: int) -> DeepEPLayout:
        per_rank, per_rdma_rank, per_expert, in_rank, _ = self.buffer.get_dispatch_layout(
            topk_idx, num_experts
        )
        return DeepEPLayout(per_rank, per_rdma_rank, per_expert, in_rank)

    def dispatch(
        self, payload: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any, num_experts: int
    ) -> Dispatched:
        if isinstance(layout, DeepEPHandle):  # DeepEP's cached dispatch: payload only
            recv, *_ = self.buffer.dispatch(payload, handle=layout.lib, config=self.dispatch_cfg)
            recv_x, scales = recv if isinstance(recv, tuple) else (recv, None)
            return Dispatched(recv_x, layout.recv_topk_idx, layout.recv_topk_weights, layout, scales)
        lay = layout if isinstance(layout, DeepEPLayout) else self.layout(topk_idx, num_experts)
        recv, recv_idx, recv_w, per_expert, handle, _ = self.buffer.dispatch(
            payload,
            num_tokens_per_rank=lay.per_rank,
            num_tokens_per_rdma_rank=lay.per_rdma_rank,
            is_token_in_rank=lay.in_rank,
            num_tokens_per_expert=lay.per_expert,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            config=self.dispatch_cfg,
        )
        recv_x, scales = recv if isinstance(recv, tuple) else (recv, None)
        return Dispatched(
            recv_x,
            recv_idx,
            recv_w,
            DeepEPHandle(handle, recv_idx, recv_w),
            scales,
            expert_counts(per_expert, num_experts // self.b.ctx.world),
        )

    def combine(self, expert_out: torch.Tensor, handle: DeepEPHandle) -> torch.Tensor:
        combined, _, _ = self.buffer.combine(expert_out, handle.lib, config=self.combine_cfg)
        return combined  # type: ignore[no-any-return]


V2_NO_GIN = (
    "DeepEP V2 (ElasticBuffer) needs NCCL GIN, NCCL's GPU-initiated networking over an RDMA NIC, even on one "
    "node; NCCL reports none on this host (an NVLink-only machine cannot run V2: use DeepEP V1, tag v1.2.1)"
)


def v2_buffer_problem(message: str) -> str | None:
    """The one-line reason for an ElasticBuffer construction error moelab recognises, or None.
    On 2xH200 without InfiniBand: csrc/kernels/backend/nccl.cu asserts `ginType != NCCL_GIN_TYPE_NONE`."""
    if "NCCL GIN is unavailable" in message or "NCCL_GIN_TYPE_NONE" in message:
        return V2_NO_GIN
    return None


class _V2Engine:
    """DeepEP V2 `ElasticBuffer`: dispatch computes its layout inside (no separate call), cached by handle."""

    phases = False
    sync = "the host waits for the receive counts (ElasticBuffer.dispatch do_cpu_sync=True)"

    def __init__(self, backend: DeepEPBackend, cases: Sequence[CaseConfig]) -> None:
        self.b = backend
        self.buffer = backend._make_v2(cases)
        self.sms = 0

    def prepare(self, case: CaseConfig) -> None:
        self.sms = case.sms or 0

    def layout(self, topk_idx: torch.Tensor, num_experts: int) -> Any:
        raise NotImplementedError("DeepEP V2 computes its layout inside dispatch")

    def dispatch(
        self, payload: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any, num_experts: int
    ) -> Dispatched:
        if isinstance(layout, DeepEPHandle):
            # ElasticBuffer.dispatch picks its automatic SM count (num_sms=0) from num_experts before it reads
            # the handle, so a cached call must name the SMs: the fresh dispatch's, as tests/elastic/test_ep.py
            # passes one count to both
            sms = self.sms or int(layout.lib.num_sms)
            recv, _, _, _, _ = self.buffer.dispatch(payload, handle=layout.lib, num_sms=sms)
            recv_x, scales = recv if isinstance(recv, tuple) else (recv, None)
            rows = layout.recv_topk_idx.shape[0]
            return Dispatched(
                recv_x[:rows],
                layout.recv_topk_idx,
                layout.recv_topk_weights,
                layout,
                None if scales is None else scales[:rows],
            )
        recv, recv_idx, recv_w, handle, _ = self.buffer.dispatch(
            payload,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            num_experts=num_experts,
            num_sms=self.sms,
            do_cpu_sync=True,
        )
        recv_x, scales = recv if isinstance(recv, tuple) else (recv, None)
        # exact with do_cpu_sync; outputs are padded to the buffer's capacity
        rows = int(handle.num_recv_tokens)
        ids, weights = recv_idx[:rows], recv_w[:rows]
        return Dispatched(
            recv_x[:rows],
            ids,
            weights,
            DeepEPHandle(handle, ids, weights, padded_rows=recv_x.shape[0]),
            None if scales is None else scales[:rows],
        )

    def combine(self, expert_out: torch.Tensor, handle: DeepEPHandle) -> torch.Tensor:
        x = expert_out
        padded = handle.padded_rows or expert_out.shape[0]
        if expert_out.shape[0] != padded:  # V2 combines the padded layout dispatch returned
            x = torch.zeros(padded, expert_out.shape[1], dtype=expert_out.dtype, device=expert_out.device)
            x[: expert_out.shape[0]] = expert_out
        combined, _, _ = self.buffer.combine(x, handle=handle.lib, num_sms=self.sms)
        return combined  # type: ignore[no-any-return]


class DeepEPTuning(TuneSpace):
    """DeepEP V1's NVL chunk sizes (Config's num_max_nvl_chunked_send_tokens of dispatch and combine; DeepEP's
    own tuning sweeps them); the settings: Buffer.set_num_sms, Config, Megatron-Core's flex dispatcher."""

    dtype = "fp8"  # as the e2e suite: DeepEP V1 bf16 traps at hidden 8192

    def knob_variants(self, sms: int | None) -> list[dict[str, Any]]:
        return [{"nvl_chunk": 12}, {"nvl_chunk": 32}, {"combine_nvl_chunk": 4}, {"combine_nvl_chunk": 16}]

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Workload) -> list[str]:
        s = sms if sms is not None else DEFAULT_CONFIG_SMS
        out = [f"DeepEP: deep_ep.Buffer.set_num_sms({s})"]
        if "nvl_chunk" in knobs or "combine_nvl_chunk" in knobs or sms is not None:
            out.append(
                f"DeepEP: dispatch config=deep_ep.Config({s}, {knobs.get('nvl_chunk', 'nvl_chunk')}, nvl_buffer, rdma_chunk, rdma_buffer), "
                f"combine config=deep_ep.Config({s}, {knobs.get('combine_nvl_chunk', 'nvl_chunk')}, ...) "
                "(unnamed values: Buffer.get_dispatch_config / get_combine_config for the rank count)"
            )
        out.append(
            f"Megatron-Core: --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep --moe-deepep-num-sms {s}"
        )
        return out


class DeepEPBackend(
    Backend, DispatchAlongHandle, HostExpertCounts, LibraryFigures, ChainedPairs, MaskedRouting, ColumnCombine
):
    name = "deepep"
    dispatch_family = "hierarchical"
    dispatch_family_source = (
        "DeepEP README (docs/legacy.md since V2) 'Normal kernels with NVLink and RDMA forwarding': RDMA to the "
        "same-index GPU of each node, then NVLink forwarding; tests/test_internode.py counts RDMA bytes once per "
        "(token, node)"
    )
    source_build: ClassVar[SourceBuild | None] = common.SOURCE_BUILD
    description = "DeepEP normal kernels (V1 Buffer, or V2 ElasticBuffer where installed)"
    payload_dtypes = ("bf16", "fp8")
    sm_control = "V1: Config(num_sms, ...) per call (chunk sizes from Buffer.get_dispatch_config/get_combine_config); V2: num_sms"
    default_config_sms: ClassVar[int] = DEFAULT_CONFIG_SMS
    phases = True  # V1; V2's ElasticBuffer is timed whole (splits_phases)
    library_ops = ("dispatch", "combine")  # what tests/test_intranode.py times, along a cached handle
    knobs: ClassVar[type[Knobs]] = DeepEPKnobs
    library_test: ClassVar[LibraryTest | None] = INTRANODE_TEST
    tuning: ClassVar[TuneSpace | None] = DeepEPTuning()
    masked_routing: ClassVar[str] = (
        "get_dispatch_layout and dispatch skip -1 entries of topk_idx (DeepEP's tests mask slots so); a token "
        "sent nowhere combines to 0"
    )
    # V1's intranode combine reduces a row in steps of 32 lanes x 16 bytes with a __syncwarp() inside the loop
    # (csrc/kernels/intranode.cu): a row that is not whole 512-byte steps (256 bf16 columns) leaves lanes out
    # of the sync and faulted on 2 x H200 (illegal address at 896 columns: DeepSeek-V3's 7168 in 8 slices)
    column_unit: ClassVar[int] = 256

    @classmethod
    def library_figures(
        cls, op: str, rows: Sequence[RankRows], bytes_per_row: int, samples_us: Sequence[Sequence[float]]
    ) -> list[Figure]:
        """tests/test_intranode.py's printed figure: rank 0's received bytes over rank 0's bench time (its
        mean after dropping the first call), for the ops it times along a cached handle."""
        if op not in cls.library_ops or not rows:
            return []
        t = common.deepep_bench_time_us(samples_us[0])
        rank0 = float(rows[0].recv_rows * bytes_per_row)
        return [
            Figure(
                definition="deepep_nvl",
                bytes_mean=rank0,
                bytes_max=rank0,
                gbps=rank0 / (t * 1e-6) / 1e9,
                text="DeepEP's own test figure (tests/test_intranode.py): rank 0's received rows x bytes/token over rank 0's mean time after dropping the first iteration, on the path that test times: dispatch with the cached handle of the same routing (op dispatch) and combine, timed as that test times them (back-to-back calls after one L2 flush, no barrier between calls)",
            )
        ]

    @classmethod
    def availability(cls) -> str | None:
        if common.find_spec_origin("deep_ep") is None:
            return f"deep_ep not installed ({common.BUILD_HINT})"
        reason = common.cuda_reason()
        if reason:
            return reason
        _, reason = common.import_deep_ep()
        return reason

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        deep_ep, reason = common.import_deep_ep()
        if deep_ep is None:
            raise BackendUnavailable(reason or "deep_ep unavailable")
        self._ep = deep_ep
        self.api = common.api_of(deep_ep)
        self._sm90 = bool(deep_ep.Buffer.is_sm90_compiled()) if self.api != "v2" else True
        runnable = [c for c in cases if self._reason(c) is None]
        self._settings = DeepEPKnobs.parse({})
        self._case: CaseConfig | None = None
        self._cast_cache = InputCache()
        self.num_nvl_bytes, self.num_rdma_bytes = 0, 0
        self._engine: _V1Engine | _V2Engine = (
            _V2Engine(self, runnable) if self.api == "v2" else _V1Engine(self, runnable)
        )

    # ---- construction -------------------------------------------------------------------------------
    def _config_tuples(self, case: CaseConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(dispatch, combine) as (sms, nvl chunk, nvl buffer, rdma chunk, rdma buffer): DeepEP's recommended
        config for the world size with the case's SMs, and any chunk/buffer knob in place of its value."""
        world = self.ctx.world
        s = DeepEPKnobs.parse(case.knobs)
        sms = case.sms if case.sms is not None else self.default_config_sms
        d, c = V1_DISPATCH_CONFIGS[world], V1_COMBINE_CONFIGS[world]

        def make(
            base: tuple[int, int, int, int], nvl_chunk: int | None, rdma_chunk: int | None
        ) -> tuple[int, ...]:
            return (
                sms,
                nvl_chunk or base[0],
                s.nvl_buffer or base[1],
                rdma_chunk or base[2],
                s.rdma_buffer or base[3],
            )

        return make(d, s.nvl_chunk, s.rdma_chunk), make(c, s.combine_nvl_chunk, s.combine_rdma_chunk)

    def _configs(self, case: CaseConfig) -> tuple[Any, Any]:
        d, c = self._config_tuples(case)
        return self._ep.Config(*d), self._ep.Config(*c)

    def _make_v1(self, cases: Sequence[CaseConfig]) -> Any:
        ep, world = self._ep, self.ctx.world
        num_nvl, num_rdma = 0, 0
        for case in cases:
            hidden_bytes = (
                case.workload.hidden * 2
            )  # bf16 rows bound the fp8 ones (DeepEP sizes with max(elem, 2))
            for cfg in self._configs(case):
                num_nvl = max(num_nvl, int(cfg.get_nvl_buffer_size_hint(hidden_bytes, world)))
                num_rdma = max(num_rdma, int(cfg.get_rdma_buffer_size_hint(hidden_bytes, world)))
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl, num_rdma
        return ep.Buffer(
            self.ctx.group,
            num_nvl,
            num_rdma,
            low_latency_mode=False,
            num_qps_per_rank=1,
            explicitly_destroy=True,
        )

    def _make_v2(self, cases: Sequence[CaseConfig]) -> Any:
        max_t = max((c.workload.tokens_per_rank for c in cases), default=1)
        max_h = max((c.workload.hidden for c in cases), default=128)
        max_k = max((c.workload.topk for c in cases), default=1)
        use_fp8 = any(c.workload.dtype == "fp8" for c in cases)
        try:
            return self._ep.ElasticBuffer(
                self.ctx.group,
                num_max_tokens_per_rank=max_t,
                hidden=max_h,
                num_topk=max_k,
                use_fp8_dispatch=use_fp8,
                explicitly_destroy=True,
            )
        except RuntimeError as exc:
            reason = v2_buffer_problem(str(exc))
            if reason:
                raise BackendUnavailable(reason) from exc
            raise

    # ---- per case ------------------------------------------------------------------------------------
    def _reason(self, case: CaseConfig) -> str | None:
        reason = type(self).planned_reason(case, Placement.of(self.ctx))
        if reason:
            return reason
        try:
            DeepEPKnobs.parse(case.knobs)
        except SpecError as exc:
            return str(exc)
        if self.api == "v2":
            if case.sms is not None and case.sms < 1:
                return f"SM count must be >= 1, got {case.sms}"
            return None  # V2 does not have V1's TMA staging limit (it is the fix of DeepEP#722)
        return v1_normal_reason(common.shape_of(self.ctx, case, self._sm90))

    def unsupported_reason(self, case: CaseConfig) -> str | None:
        return self._reason(case)

    def splits_phases(self) -> bool:
        return self._engine.phases

    def prepare(self, case: CaseConfig) -> None:
        self._case = case
        self._settings = DeepEPKnobs.parse(case.knobs)
        self._cast_cache.clear()
        self._engine.prepare(case)

    def _payload(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        assert self._case is not None
        if self._case.workload.dtype != "fp8":
            return x

        def cast() -> tuple[torch.Tensor, torch.Tensor]:
            x_fp8, scales = common.per_token_cast_to_fp8(x)
            return (
                x_fp8,
                scales.T.contiguous().T,
            )  # column-major scales, as tests/test_intranode.py passes them

        if self._settings.fp8_cast == "inside":
            return cast()
        return self._cast_cache.get([x], cast)  # type: ignore[no-any-return]

    def _num_experts(self) -> int:
        assert self._case is not None
        return self._case.workload.num_experts(self.ctx.world)

    # ---- the contract --------------------------------------------------------------------------------
    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        return self._engine.layout(topk_idx, self._num_experts())

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        return self._engine.dispatch(self._payload(x), topk_idx, topk_weights, layout, self._num_experts())

    def combine(self, expert_out: torch.Tensor, handle: DeepEPHandle) -> torch.Tensor:
        return self._engine.combine(expert_out, handle)

    def close(self) -> None:
        buf, self._engine.buffer = self._engine.buffer, None
        if buf is not None:
            torch.cuda.synchronize()
            buf.destroy()

    def host_sync_ops(self) -> dict[str, str]:
        return {"dispatch_fresh": self._engine.sync, "roundtrip": self._engine.sync}

    def expert_counts_on_host(self) -> bool:
        return isinstance(self._engine, _V1Engine)

    def library_versions(self) -> dict[str, str]:
        out = common.deep_ep_versions(self._ep, self.api)
        out["torch"] = torch.__version__
        if torch.cuda.is_available() and torch.cuda.nccl.is_available([]):  # type: ignore[no-untyped-call]
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        return out

    def record(self, case: CaseConfig) -> dict[str, Any]:
        s = DeepEPKnobs.parse(case.knobs)
        out: dict[str, Any] = {
            "api": {"v2": "V2 ElasticBuffer", "v1+hybrid": "V1 Buffer", "v1": "V1 Buffer"}[self.api],
            "fp8_cast": s.fp8_cast if case.workload.dtype == "fp8" else None,
            "sms": case.sms
            if case.sms is not None
            else ("auto" if self.api == "v2" else self.default_config_sms),
            "num_nvl_bytes": self.num_nvl_bytes,
            "num_rdma_bytes": self.num_rdma_bytes,
            "library_figure": "deepep_nvl on ops dispatch (cached handle) and combine, as tests/test_intranode.py times them",
        }
        if isinstance(self._engine, _V1Engine) and self.ctx.world in V1_DISPATCH_CONFIGS:
            d, c = self._config_tuples(case)
            out["dispatch_config"], out["combine_config"] = (
                list(d),
                list(c),
            )  # Config(sms, nvl chunk, nvl buf, rdma chunk, rdma buf)
        return out

    def dispatch_with_handle(self, rows: torch.Tensor, handle: DeepEPHandle) -> torch.Tensor:
        """Send one row per source token (`rows` [T, H] bf16, the gradient of combine's output) along an
        earlier dispatch's handle: [R, H] bf16 in that dispatch's received order. The backward of combine
        (moelab.measure.e2e), as DeepEP's README has it: a dispatch with the forward's handle (cached layout, no
        host wait). fp8 workloads send the gradient as fp8 with per-128 scales, as their forward did
        (V1's intranode bf16 dispatch at hidden 8192 breaks the TMA staging limit); dequantized here."""
        payload: Any = rows
        if self._case is not None and self._case.workload.dtype == "fp8":
            x_fp8, scales = common.per_token_cast_to_fp8(rows)
            payload = (x_fp8, scales.T.contiguous().T)
        got = self._engine.dispatch(
            payload, rows, rows, handle, self._num_experts()
        )  # cached: along `handle`
        return got.recv_x_float().to(torch.bfloat16) if got.recv_scales is not None else got.recv_x
