"""`hybrid-ep`: NVIDIA Hybrid-EP (`deep_ep.HybridEPBuffer`, branch hybrid-ep of DeepEP).

Paths (knobs): plain `dispatch` / `combine` (default); `permute = true`: `dispatch_with_permute` /
`combine_with_unpermute` (expert-major rows, padded to `pad_multiple`); `fused = true`: the same with
`fuse_permute_dispatch` / `fuse_unpermute_combine` (one kernel each way).
Each path is a class of moelab.backends.hybrid_ep_paths, made by prepare() for the case's knobs; the
library's handle is read by name through moelab.backends.hybrid_ep_handle, whose fields are checked once
against the build's HandleImpl when the backend starts.
Phases (plain path): `layout` is the metadata preprocessing (`update_template_config` +
`runtime.metadata_preprocessing`, what `HybridEPBuffer.dispatch` runs when given no handle); `dispatch` with
a handle is the call Hybrid-EP's own benchmark times (tests/test_hybrid_ep.py `dispatch_args['handle']`,
routing passed too), so the Hybrid-EP figure is computed from it; `dispatch_fresh` is the handle-less call.
Every dispatch synchronizes the stream on the host (the number of received tokens comes through pinned
memory) because no `num_dispatched_tokens` is passed, as in that benchmark: host_sync_ops. The permute and
fused paths preprocess inside `dispatch_with_permute` and are timed whole (no phase split).

The contract wants one row per (token, this rank) with local expert ids: the plain path delivers exactly
those rows; the local ids and weights are taken from the handle's `local_expert_routing_map` and the
dispatched probs (a few element-wise kernels in the timed dispatch). The permute paths deliver one row per
(token, local expert): one copy per token is exposed, and combine puts each row in that copy with zeros in
the others (an adapter, made once per (expert_out, handle) and reused by the timed combine).

fp8: cast once per input tensor with DeepEP's per_token_cast_to_fp8 (1x128 blocks, float32 scales), passed
as uint8 bytes plus `scaling_factor`, outside the timed region as Hybrid-EP's test prepares its inputs.
SMs: `num_sms_dispatch_api` / `num_sms_combine_api` are HybridEPBuffer constructor arguments, so one buffer
is made per (SM count, payload type, experts per rank) present in the job, all in __init__.
Compiled kernels: the library JIT-builds each configuration into a folder of its own per process; moelab
seeds that folder from its kernel store before the buffers are made (`load_cached_kernels=True`) and
harvests what this process compiled back into it (moelab.backends.jit_cache), so only the first job of a
configuration on a machine pays nvcc.
"""

from __future__ import annotations

import inspect
import os
import pwd
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from moelab.backends import deepep_common as common
from moelab.backends.base import Backend, BackendContext, CaseConfig, Dispatched, Placement
from moelab.backends.capabilities import DispatchAlongHandle, HandleDispatchReason, LibraryFigures
from moelab.backends.deepep_rules import hybrid_ep_reason
from moelab.backends.hybrid_ep_handle import PlainHandle, handle_fields_reason
from moelab.backends.hybrid_ep_own_test import HYBRID_EP_TEST
from moelab.backends.hybrid_ep_paths import (
    HybridHandle,
    HybridKnobs,
    HybridPath,
    HybridSettings,
    PlainPath,
    path_for,
)
from moelab.backends.input_cache import InputCache
from moelab.backends.jit_cache import KernelStore, build_identity, hybrid_ep_process_folder
from moelab.backends.knobs import Knobs
from moelab.backends.library_test import LibraryTest
from moelab.backends.tuning import TuneSpace, even_sms
from moelab.core.case_record import Figure
from moelab.core.errors import BackendUnavailable, SpecError
from moelab.core.rows import RankRows
from moelab.core.workload import Workload


class HybridTuning(TuneSpace):
    """Hybrid-EP's combine SMs apart from dispatch's; the settings: HybridEPBuffer's SM counts and
    Megatron-Core's flex dispatcher."""

    def knob_variants(self, sms: int | None) -> list[dict[str, Any]]:
        if sms is None:
            return []
        return [{"combine_sms": s} for s in (even_sms(sms / 2), even_sms(sms * 1.5)) if s != sms]

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Workload) -> list[str]:
        if sms is None:
            return ["Hybrid-EP: deep_ep.HybridEPBuffer(...) with its default SM counts"]
        return [
            f"Hybrid-EP: deep_ep.HybridEPBuffer(..., num_sms_dispatch_api={sms}, "
            f"num_sms_combine_api={knobs.get('combine_sms', sms)})",
            f"Megatron-Core: --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-hybridep-num-sms {sms}",
        ]


class HybridEPBackend(Backend, DispatchAlongHandle, HandleDispatchReason, LibraryFigures):
    name = "hybrid-ep"
    dispatch_family = "hierarchical"
    dispatch_family_source = (
        "DeepEP hybrid-ep branch, docs/README_Hybrid-EP.md 'Hierarchical Communication Design': RDMA between "
        "nodes, NVLink (TMA) inside a node"
    )
    description = (
        "NVIDIA Hybrid-EP (deep_ep.HybridEPBuffer, DeepEP branch hybrid-ep); plain, permute and fused paths"
    )
    payload_dtypes = ("bf16", "fp8")
    compiles_on_first_call = True  # per configuration and process; moelab's kernel store reuses them
    sm_control = "HybridEPBuffer(num_sms_dispatch_api=sms, num_sms_combine_api=sms): one buffer per SM count"
    phases = True  # the plain path; the permute paths are timed whole (splits_phases)
    library_ops = ("dispatch", "combine")  # what tests/test_hybrid_ep.py times, along a cached handle
    knobs: ClassVar[type[Knobs]] = HybridKnobs
    library_test: ClassVar[LibraryTest | None] = HYBRID_EP_TEST
    tuning: ClassVar[TuneSpace | None] = HybridTuning()

    @classmethod
    def library_figures(
        cls, op: str, rows: Sequence[RankRows], bytes_per_row: int, samples_us: Sequence[Sequence[float]]
    ) -> list[Figure]:
        """tests/test_hybrid_ep.py's printed figure (_report_bw): rank 0's bytes over the mean, across ranks,
        of each rank's mean time, for the ops it times along a cached handle."""
        if op not in cls.library_ops or not rows:
            return []
        rank0 = float(rows[0].recv_rows * bytes_per_row)
        lib = common.hybrid_ep_figure(rank0, [sum(s) / len(s) for s in samples_us])
        return [
            Figure(
                definition=lib.definition,
                bytes_mean=rank0,
                bytes_max=rank0,
                gbps=lib.gbps,
                text="Hybrid-EP's own test figure (tests/test_hybrid_ep.py _report_bw): rank 0's received rows x bytes/token over the mean, across ranks, of each rank's mean time, on the path that test times: dispatch along the cached handle with the routing passed (op dispatch, plain path) and combine, timed as that test times them (back-to-back calls after one L2 flush, no barrier between calls)",
            )
        ]

    @classmethod
    def availability(cls) -> str | None:
        if common.find_spec_origin("deep_ep") is None:
            return f"deep_ep not installed (Hybrid-EP: {common.BUILD_HINT.replace('tag v1.2.1 or branch hybrid-ep', 'branch hybrid-ep')})"
        if common.find_spec_origin("hybrid_ep_cpp") is None:
            return "deep_ep has no HybridEPBuffer (no hybrid_ep_cpp extension: this build is not the hybrid-ep branch of DeepEP)"
        reason = common.cuda_reason()
        if reason:
            return reason
        deep_ep, reason = common.import_deep_ep()
        if deep_ep is None:
            return reason
        if not hasattr(deep_ep, "HybridEPBuffer"):
            return (
                "deep_ep has no HybridEPBuffer (this build is V1 or V2; Hybrid-EP lives on branch hybrid-ep)"
            )
        return None

    @staticmethod
    def diagnostics() -> list[str]:
        """Lines for `moelab backends`: what to check when the extension crashes in its constructor."""
        out = []
        for name, path in common.extension_paths(("hybrid_ep_cpp", "deep_ep_cpp")).items():
            warning = common.libstdcxx_diagnosis(path)
            if warning:
                out.append(f"{name}: {warning}")
        return out

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        deep_ep, reason = common.import_deep_ep()
        if deep_ep is None or not hasattr(deep_ep, "HybridEPBuffer"):
            raise BackendUnavailable(reason or "deep_ep has no HybridEPBuffer")
        import hybrid_ep_cpp  # the extension deep_ep.hybrid_ep_buffer imports

        wrong = handle_fields_reason(hybrid_ep_cpp.HandleImpl())  # once: the handle moelab reads by name
        if wrong:
            raise BackendUnavailable(f"hybrid-ep: {wrong}")
        self._ep = deep_ep
        runnable = [c for c in cases if self.unsupported_reason(c) is None]
        self.max_tokens = max((c.workload.tokens_per_rank for c in runnable), default=16)
        self.max_hidden = max((c.workload.hidden for c in runnable), default=512)
        self._buffers: dict[tuple[Any, ...], Any] = {}
        self._kernels, self._seeded = self._seed(self._kernel_store(deep_ep, ctx))
        loadable = self._kernels.loadable() if self._kernels is not None else 0
        reuse = loadable > 0 and _accepts(deep_ep.HybridEPBuffer, "load_cached_kernels")
        extra = {"load_cached_kernels": True} if reuse else {}
        for case in runnable:
            key = self._key(case)
            if key not in self._buffers:
                sms, use_fp8, epr, combine_sms = key
                self._buffers[key] = deep_ep.HybridEPBuffer(
                    group=ctx.group,
                    hidden_dim=self.max_hidden,
                    max_num_of_tokens_per_rank=self.max_tokens,
                    num_local_experts=epr,
                    use_fp8=use_fp8,
                    num_sms_dispatch_api=sms,
                    num_sms_combine_api=combine_sms,
                    **extra,
                )
        self._buf: Any = None
        self._case: CaseConfig | None = None
        self._path: HybridPath | None = None
        self._cast_cache = InputCache()

    @staticmethod
    def _kernel_store(deep_ep: Any, ctx: BackendContext) -> KernelStore | None:
        """This build's folder of moelab's kernel store and this process's JIT folder; None when the job
        keeps no store (--kernel-cache off) or does not run on CUDA."""
        if ctx.kernel_cache is None or ctx.device.type != "cuda":
            return None
        package = Path(deep_ep.__file__).parent
        binaries = [Path(p) for p in common.extension_paths(("hybrid_ep_cpp",)).values()]
        sources = [p for p in (package / "backend").rglob("*") if p.is_file()]
        major, minor = torch.cuda.get_device_capability(ctx.device)
        facts = {
            "sm": f"{major}{minor}",
            "cuda": str(torch.version.cuda),
            "cuda_home": os.environ.get("CUDA_HOME", ""),
        }
        identity = build_identity(binaries, sources, facts)
        try:
            home: str | None = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = None
        process = hybrid_ep_process_folder(os.getpid(), os.environ, home)
        return KernelStore(store=ctx.kernel_cache / "hybrid-ep" / identity, process=process)

    def _seed(self, kernels: KernelStore | None) -> tuple[KernelStore | None, int]:
        """The store and how many kernels it seeded; a store that cannot be used only costs the reuse."""
        if kernels is None:
            return None, 0
        try:
            return kernels, kernels.seed()
        except OSError as exc:
            self._store_unusable(kernels, exc)
            return None, 0

    def _harvest(self) -> None:
        if self._kernels is None:
            return
        try:
            self._kernels.harvest()
        except OSError as exc:  # e.g. --kernel-cache on a read-only or full file system
            self._store_unusable(self._kernels, exc)
            self._kernels = None

    @staticmethod
    def _store_unusable(kernels: KernelStore, exc: OSError) -> None:
        print(
            f"hybrid-ep: kernel store {kernels.store} unusable ({exc}); this job compiles its own", flush=True
        )

    @staticmethod
    def _key(case: CaseConfig) -> tuple[Any, ...]:
        s = HybridSettings.from_knobs(case.knobs)
        return (
            case.sms,
            case.workload.dtype == "fp8",
            case.workload.experts_per_rank,
            s.combine_sms or case.sms,
        )

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        reason = super().planned_reason(case, where)
        if reason:
            return reason
        try:
            s = HybridSettings.from_knobs(case.knobs)
        except SpecError as exc:
            return str(exc)
        return hybrid_ep_reason(common.shape_of(where, case), fused=s.fused)

    def prepare(self, case: CaseConfig) -> None:
        self._harvest()  # what the previous case compiled survives a job killed later on
        self._case = case
        self._buf = self._buffers[self._key(case)]
        self._path = path_for(self._buf, HybridSettings.from_knobs(case.knobs), case.workload, self.ctx.world)
        self._cast_cache.clear()

    def _payload(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self._case is not None
        if self._case.workload.dtype != "fp8":
            return x, None

        def cast() -> tuple[torch.Tensor, torch.Tensor]:
            x_fp8, scales = common.per_token_cast_to_fp8(x)
            return x_fp8.view(torch.uint8), scales.contiguous()  # Hybrid-EP takes fp8 bytes as uint8

        cached: tuple[torch.Tensor, torch.Tensor | None] = self._cast_cache.get([x], cast)
        return cached

    def _prepared_path(self) -> HybridPath:
        assert self._path is not None, "prepare() a case first"
        return self._path

    def splits_phases(self) -> bool:
        return self._prepared_path().phases

    def library_timed_ops(self) -> tuple[str, ...]:
        # its test's dispatch/combine lines time the plain path
        return type(self).library_ops if self._prepared_path().phases else ()

    def layout(self, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> HybridHandle:
        """What HybridEPBuffer.dispatch runs first when it has no handle: the routing map and the metadata
        preprocessing (its allgather of routing maps and the per-rank token layout)."""
        assert self._case is not None
        from deep_ep.hybrid_ep_buffer import indices_to_map

        wl = self._case.workload
        # the routing's own token count, as HybridEPBuffer.dispatch takes it from its input: a two-batch
        # overlap lays out micro-batches of half the case's tokens
        num_tokens = int(topk_idx.shape[0])
        routing_map, _ = indices_to_map(topk_idx, topk_weights, num_tokens, wl.num_experts(self.ctx.world))
        config = self._buf.update_template_config(hidden_dim=wl.hidden, num_of_tokens_per_rank=num_tokens)
        impl = self._buf.runtime.metadata_preprocessing(
            config=config,
            routing_map=routing_map,
            num_of_tokens_per_rank=num_tokens,
            enable_permute=False,
            non_blocking=False,
        )
        return HybridHandle(lib=PlainHandle.of_impl(impl), rows_pos=None, num_permuted=None)

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        hidden, scales = self._payload(x)
        return self._prepared_path().dispatch(hidden, scales, topk_idx, topk_weights, layout)

    def combine(self, expert_out: torch.Tensor, handle: HybridHandle) -> torch.Tensor:
        return self._prepared_path().combine(expert_out, handle)

    def close(self) -> None:
        self._harvest()
        self._buffers.clear()
        self._buf = None
        self._path = None

    def host_sync_ops(self) -> dict[str, str]:
        return self._prepared_path().host_sync_ops()

    def library_versions(self) -> dict[str, str]:
        out = common.deep_ep_versions(self._ep, common.api_of(self._ep))
        out["torch"] = torch.__version__
        for line in self.diagnostics():
            out.setdefault("diagnostics", line)
        return out

    def record(self, case: CaseConfig) -> dict[str, Any]:
        s = HybridSettings.from_knobs(case.knobs)
        return {
            "api": "HybridEPBuffer",
            "path": s.path,
            "fused": s.fused,
            "pad_multiple": s.pad_multiple,
            "sms_dispatch": case.sms if case.sms is not None else "default",
            "sms_combine": s.combine_sms or (case.sms if case.sms is not None else "default"),
            "buffer_max_tokens": self.max_tokens,
            "buffer_hidden": self.max_hidden,
            "fp8_cast": "outside (once per input)" if case.workload.dtype == "fp8" else None,
            "kernel_store": str(self._kernels.store) if self._kernels is not None else None,
            "kernels_reused": self._seeded,
            "library_figure": "hybrid_ep_rank0_bytes_over_mean_time (tests/test_hybrid_ep.py _report_bw)",
        }

    def dispatch_with_handle_reason(self) -> str | None:
        """Why the prepared case cannot send rows along a handle (the e2e layer's backward), or None."""
        return self._prepared_path().handle_dispatch_reason()

    def dispatch_with_handle(self, rows: torch.Tensor, handle: HybridHandle) -> torch.Tensor:
        """Send one row per source token (`rows` [T, H] bf16, the gradient of combine's output) along an
        earlier dispatch's handle: [R, H] bf16 in that dispatch's received order. The backward of combine
        (moelab.measure.e2e), as Hybrid-EP's docstring has it (`dispatch_in_backward`): `dispatch(hidden, handle=...)`
        with the received row count passed, so there is no host sync. fp8 cases send fp8 with per-128
        scales, as their forward (the buffer was built for fp8), dequantized here; bf16 rows are copied out
        of the library's receive buffer, which the next dispatch reuses."""
        assert self._case is not None
        path = self._prepared_path()
        assert isinstance(path, PlainPath), path.handle_dispatch_reason()
        fp8 = self._case.workload.dtype == "fp8"
        scales: torch.Tensor | None = None
        hidden = rows
        if fp8:
            x_fp8, scales = common.per_token_cast_to_fp8(rows)
            hidden, scales = x_fp8.view(torch.uint8), scales.contiguous()
        token, _, recv_scales, _ = path.dispatch_along(hidden, scales, handle)
        if not fp8:
            copied: torch.Tensor = token.clone()
            return copied
        got = Dispatched(
            recv_x=token.view(torch.float8_e4m3fn),
            recv_topk_idx=token.new_empty(0),
            recv_topk_weights=token.new_empty(0),
            handle=None,
            recv_scales=recv_scales,
        )
        return got.recv_x_float().to(torch.bfloat16)


def _accepts(fn: Any, name: str) -> bool:
    """Whether `fn` takes keyword `name` (older Hybrid-EP builds have no load_cached_kernels)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
