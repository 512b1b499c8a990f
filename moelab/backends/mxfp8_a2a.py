"""`mxfp8-a2a`: `nccl-a2a`'s dispatch/combine with the payload quantized to MXFP8 for the wire, dequantized to
bf16 on receipt, the path torchtitan takes through torchao's `to_mxfp8_a2a_dequant`, here runnable on
Hopper (moelab's Triton quantizer) and on the CPU (plain torch, gloo).

Knobs (per case; torchtitan's `expert_parallel_a2a_dispatch_impl` / `..._combine_impl`):
- `dispatch_impl`: "bf16" or "mxfp8"; defaults to the workload's dtype, which must agree with it (the
  workload dtype is what the byte accounting uses: mxfp8 = hidden + hidden/32 bytes per token).
- `combine_impl`: "bf16" or "mxfp8", default "mxfp8": torchtitan's MX expert-parallel path quantizes both
  directions, and its fastest configuration in the PR that added the knobs quantized both.
- `rounding`: "rceil" (default, torchao's), "floor" (OCP), "ceil" or "even" (torchao's CEIL and EVEN; see
  moelab/quant/mxfp8.py). `quantizer`: "auto" (torchao on SM100+ for rceil and floor, moelab's Triton
  kernel on SM89+, else plain torch), "torch", "triton" or "torchao".

How: a token is quantized once at its source, before the rows are gathered per destination (torchao
quantizes the gathered rows; per-row quantization gives the same bits, on fewer rows), packed as
[E4M3 data | E8M0 scales | pad to even] bytes and handed to `NcclA2ABackend.dispatch` viewed as a bf16
row, so the routing, the count exchange and the all_to_all_single calls are nccl-a2a's own; uint8
bytes are what crosses the wire either way (gloo refuses float8 dtypes). Combine quantizes the expert
output rows, sends them back with nccl-a2a's splits, dequantizes, and sums at the source in bf16.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from moelab.backends.base import BackendContext, CaseConfig, Dispatched, Placement
from moelab.backends.knobs import UNKNOWN, Knobs, knob
from moelab.backends.nccl_a2a import A2AHandle, NcclA2ABackend, NcclTuning, exchange_field, exchange_knob
from moelab.backends.tuning import TuneSpace
from moelab.core.errors import BackendUnavailable, SpecError
from moelab.core.workload import Workload, payload_bytes_per_token
from moelab.quant import mxfp8

PAYLOADS = ("bf16", "mxfp8")
DEFAULT_COMBINE_IMPL = "mxfp8"
ONE_OF = "{owner}: {name} must be {want}"


@dataclass(frozen=True, kw_only=True)
class Mxfp8Knobs(Knobs):
    owner = "mxfp8-a2a"
    unknown_message = "{owner}: unknown knob(s) {unknown} (knobs: {declared})"
    dispatch_impl: str | None = knob(
        None,
        "bf16 | mxfp8: the dispatch payload on the wire (must match the workload dtype)",
        choices=PAYLOADS,
        refusal=ONE_OF,
    )
    combine_impl: str = knob(
        DEFAULT_COMBINE_IMPL,
        "bf16 | mxfp8 (default): the combine payload on the wire",
        choices=PAYLOADS,
        refusal=ONE_OF,
    )
    rounding: str = knob(
        "rceil",
        "rceil (default, torchao's) | floor (OCP)",
        choices=mxfp8.ROUNDINGS,
        refusal="unknown MXFP8 scale rounding {value!r}: choose one of {choices}",
    )
    quantizer: str = knob("auto", "auto | torch | triton | torchao", choices=mxfp8.IMPLS, refusal=ONE_OF)
    exchange: str = exchange_field()

    def check(self, workload: Workload) -> None:
        dispatch_impl = self.dispatch_impl or workload.dtype
        if dispatch_impl not in PAYLOADS:
            raise SpecError(f"{self.owner}: dispatch_impl must be one of {', '.join(PAYLOADS)}")
        if dispatch_impl != workload.dtype:
            raise SpecError(
                f"{self.owner}: dispatch_impl {dispatch_impl} contradicts the workload dtype {workload.dtype}: "
                f"set the workload dtype to {dispatch_impl} instead"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Mxfp8Settings:
    """One case's choices, validated."""

    dispatch_impl: str
    combine_impl: str
    rounding: str
    quantizer: str  # as asked: auto / torch / triton / torchao

    @property
    def quantizes(self) -> bool:
        return "mxfp8" in (self.dispatch_impl, self.combine_impl)

    @classmethod
    def from_case(cls, case: CaseConfig) -> Mxfp8Settings:
        knobs = Mxfp8Knobs.parse(case.knobs)
        knobs.check(case.workload)
        return cls(
            dispatch_impl=knobs.dispatch_impl or case.workload.dtype,
            combine_impl=knobs.combine_impl,
            rounding=knobs.rounding,
            quantizer=knobs.quantizer,
        )


class Mxfp8Tuning(NcclTuning):
    """nccl-a2a's settings, and torchtitan's MX expert-parallel all-to-all."""

    dtype = "mxfp8"

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Workload) -> list[str]:
        return super().settings(sms, knobs, workload) + [
            "torchtitan: --parallelism.expert_parallel_a2a_dispatch_impl "
            f"{'mxfp8' if workload.dtype == 'mxfp8' else 'bf16'} --parallelism.expert_parallel_a2a_combine_impl "
            f"{knobs.get('combine_impl', 'mxfp8')}"
        ]


class Mxfp8A2ABackend(NcclA2ABackend):
    name = "mxfp8-a2a"
    description = "nccl-a2a with MXFP8 payloads (E4M3 + E8M0 per 32), dequantized to bf16 on receipt"
    payload_dtypes = ("bf16", "mxfp8")
    knobs: ClassVar[type[Knobs]] = Mxfp8Knobs
    tuning: ClassVar[TuneSpace | None] = Mxfp8Tuning()
    column_unit: ClassVar[int] = mxfp8.BLOCK  # a slice quantizes in whole 32-column blocks

    @classmethod
    def check_knobs(cls, knobs: Mapping[str, Any], workload: Workload) -> None:
        if workload.dtype not in cls.payload_dtypes:  # e.g. fp8 from `--dtype bf16,fp8`: an unsupported case
            cls.knobs.refuse_unknown(knobs, cls.name, message=UNKNOWN)
            exchange_knob(knobs)
            return
        super().check_knobs(knobs, workload)

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        super().__init__(ctx, cases)
        quantized = [c for c in cases if self._settings_or_none(c) is not None]
        world, dev = ctx.world, ctx.device
        max_tokens = max((c.workload.tokens_per_rank for c in quantized), default=0)
        max_rows = max((c.workload.tokens_per_rank * world for c in quantized), default=0)
        max_hidden = max((c.workload.hidden for c in quantized), default=0)
        max_packed = mxfp8.packed_row_bytes(max_hidden)
        self._pack_src = torch.empty(max_tokens * max_packed, dtype=torch.uint8, device=dev)
        self._pack_out = torch.empty(max_rows * max_packed, dtype=torch.uint8, device=dev)
        self._recv_deq = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._back_deq = torch.empty(max_rows * max_hidden, dtype=torch.bfloat16, device=dev)
        self._settings = Mxfp8Settings(
            dispatch_impl="bf16", combine_impl="bf16", rounding="rceil", quantizer="torch"
        )
        self._quant_impl = "torch"
        self._dequant_impl = "torch"

    @staticmethod
    def _settings_or_none(case: CaseConfig) -> Mxfp8Settings | None:
        try:
            settings = Mxfp8Settings.from_case(case)
        except SpecError:
            return None
        return settings if settings.quantizes and case.workload.hidden % mxfp8.BLOCK == 0 else None

    @classmethod
    def planned_reason(cls, case: CaseConfig, where: Placement) -> str | None:
        reason = super().planned_reason(case, where)
        if reason is not None:
            return reason
        try:
            settings = Mxfp8Settings.from_case(case)
        except SpecError as exc:
            return str(exc)
        if settings.quantizes and case.workload.hidden % mxfp8.BLOCK != 0:
            return f"MXFP8 needs hidden divisible by {mxfp8.BLOCK}, got {case.workload.hidden}"
        return None

    def unsupported_reason(self, case: CaseConfig) -> str | None:
        reason = super().unsupported_reason(case)
        if reason is not None:
            return reason
        settings = Mxfp8Settings.from_case(case)
        if settings.quantizes and settings.quantizer != "auto":
            why = mxfp8.impl_unavailable_reason(settings.quantizer, self.ctx.device)
            if why is not None:
                return f"quantizer {settings.quantizer}: {why}"
        return None

    def _resolved(self, settings: Mxfp8Settings) -> tuple[str, str]:
        """(quantizer, dequantizer) that run for `settings` on this rank's device."""
        try:
            quant = mxfp8.resolve_impl(settings.quantizer, self.ctx.device)
        except BackendUnavailable:
            quant = "unavailable"
        dequant = (
            "torch"
            if quant == "torch"
            else ("triton" if mxfp8.triton_unavailable_reason(self.ctx.device) is None else "torch")
        )
        return quant, dequant

    def prepare(self, case: CaseConfig) -> None:
        super().prepare(case)
        self._settings = Mxfp8Settings.from_case(case)
        self._quant_impl = mxfp8.resolve_impl(self._settings.quantizer, self.ctx.device)
        self._dequant_impl = self._resolved(self._settings)[1]

    def _quantize_rows(self, x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> the packed rows [N, P/2] viewed as bf16, written into `buffer`."""
        num_rows, hidden = x.shape
        width = mxfp8.packed_row_bytes(hidden)
        packed = buffer[: num_rows * width].view(num_rows, width)
        out = (packed[:, :hidden], packed[:, hidden : hidden + hidden // mxfp8.BLOCK])
        mxfp8.quantize_mxfp8(x, self._settings.rounding, self._quant_impl, out=out)
        return packed.view(torch.bfloat16)

    def _dequantize_rows(self, carrier: torch.Tensor, hidden: int, buffer: torch.Tensor) -> torch.Tensor:
        """Packed rows [N, P/2] (bf16 view) -> bf16 [N, H] in `buffer`."""
        packed = carrier.view(torch.uint8)
        num_rows = packed.shape[0]
        out = buffer[: num_rows * hidden].view(num_rows, hidden)
        data, scales = packed[:, :hidden], packed[:, hidden : hidden + hidden // mxfp8.BLOCK]
        return mxfp8.dequantize_mxfp8(data, scales, torch.bfloat16, self._dequant_impl, out=out)

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        if self._settings.dispatch_impl == "bf16":
            return super().dispatch(x, topk_idx, topk_weights, layout=layout)
        hidden = x.shape[1]
        carrier = self._quantize_rows(x, self._pack_src)
        got = super().dispatch(carrier, topk_idx, topk_weights, layout=layout)
        got.recv_x = self._dequantize_rows(got.recv_x, hidden, self._recv_deq)
        return got

    def combine(self, expert_out: torch.Tensor, handle: A2AHandle) -> torch.Tensor:
        if self._settings.combine_impl == "bf16":
            return super().combine(expert_out, handle)
        hidden = expert_out.shape[1]
        carrier = self._quantize_rows(expert_out, self._pack_out)
        back = self._exchange_back(carrier, handle)
        return self._sum_at_source(self._dequantize_rows(back, hidden, self._back_deq), handle)

    def combine_dtype(self, case: CaseConfig) -> str:
        return Mxfp8Settings.from_case(case).combine_impl

    @classmethod
    def stored_combine_dtype(cls, knobs: Mapping[str, Any]) -> str:
        return str(knobs.get("combine_impl", DEFAULT_COMBINE_IMPL))

    def library_versions(self) -> dict[str, str]:
        versions = super().library_versions()
        try:
            import triton

            versions["triton"] = triton.__version__
        except ImportError:
            pass
        from moelab.quant import mxfp8_torchao

        torchao_version = mxfp8_torchao.version()
        if torchao_version is not None:
            versions["torchao"] = torchao_version
        return versions

    def record(self, case: CaseConfig) -> dict[str, Any]:
        recorded = super().record(case)
        settings = Mxfp8Settings.from_case(case)
        quant, dequant = self._resolved(settings) if settings.quantizes else ("none", "none")
        hidden = case.workload.hidden
        recorded.update(
            dispatch_impl=settings.dispatch_impl,
            combine_impl=settings.combine_impl,
            rounding=settings.rounding,
            quantizer_requested=settings.quantizer,
            quantizer=quant,
            dequantizer=dequant,
            dispatch_bytes_per_token=payload_bytes_per_token(hidden, settings.dispatch_impl),
            combine_bytes_per_token=payload_bytes_per_token(hidden, settings.combine_impl),
            wire_bytes_per_token_padded=mxfp8.packed_row_bytes(hidden),
        )
        return recorded
