"""The derived figures of one e2e case, as a table of metric definitions over the ops' medians.

Every figure is a median of the slowest rank per iteration (moelab.core.stats.summarize), kept with
its unit and a definition that says how it was made; a figure that cannot be formed (a zero time) is
stored as None. Which metrics a case gets depends on its settings: `profile = layer` timed the layer
alone, the overlapped modes add the comparison with the serial layer, `backward` the forward+backward
figures and gradient errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moelab.core.e2e_spec import OVERLAPPED, E2ESettings
from moelab.core.stats import summarize
from moelab.core.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricInputs:
    """What a metric is computed from: the ops' medians (µs) and the case that timed them."""

    med: Mapping[str, float]
    settings: E2ESettings
    workload: Workload
    pairs_per_rank: Sequence[int]
    check: Mapping[str, Any]

    @property
    def layer(self) -> float:
        return self.med["layer"]

    @property
    def comm(self) -> float:
        return self.med["dispatch"] + self.med["combine"]

    @property
    def exposed(self) -> float:
        return self.layer - self.med["compute_only"]

    @property
    def flops_per_rank(self) -> float:
        hidden, inter, pairs = self.workload.hidden, self.settings.intermediate, self.pairs_per_rank
        return sum(6.0 * p * hidden * inter for p in pairs) / max(len(pairs), 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricDef:
    name: str
    unit: str
    definition: str  # a template: {mode} and {chunks} are the case's
    value: Callable[[MetricInputs], float | None]


def _tokens_per_s(m: MetricInputs, op: str) -> float | None:
    t = m.med[op]
    return m.workload.tokens_per_rank / (t * 1e-6) if t > 0 else None


def _overlap_efficiency(m: MetricInputs) -> float | None:
    comm = m.comm
    return (comm - m.exposed) / comm if comm > 0 else None


def _gemm_tflops(m: MetricInputs) -> float | None:
    gemm = m.med["gemm"]
    return m.flops_per_rank / (gemm * 1e-6) / 1e12 if gemm > 0 else None


def _gemm_slowdown(m: MetricInputs) -> float | None:
    alone = m.med["gemm_mb"]
    return m.med["gemm_mb_under_comm"] / alone - 1.0 if alone > 0 else None


def _ratio_of(num_op: str, den_op: str) -> Callable[[MetricInputs], float | None]:
    def ratio(m: MetricInputs) -> float | None:
        den = m.med[den_op]
        return m.med[num_op] / den if den > 0 else None

    return ratio


LAYER = (
    MetricDef(name="layer_us", unit="us", value=lambda m: m.layer,
              definition="median forward layer time ({mode}), slowest rank per iteration"),
    MetricDef(name="tokens_per_s_per_rank", unit="tokens/s", value=lambda m: _tokens_per_s(m, "layer"),
              definition="tokens per rank / layer time"),
)  # fmt: skip
COMM = (
    MetricDef(name="comm_us", unit="us", value=lambda m: m.comm,
              definition="dispatch + combine, each timed alone on the whole batch"),
    MetricDef(name="exposed_comm_us", unit="us", value=lambda m: m.exposed,
              definition="time the expert compute waits: layer time - compute_only time (expert compute alone, "
                         "whole batch)"),
    MetricDef(name="exposed_comm_share", unit="ratio",
              value=lambda m: m.exposed / m.layer if m.layer > 0 else None,
              definition="exposed_comm_us / layer_us"),
    MetricDef(name="overlap_efficiency", unit="ratio", value=_overlap_efficiency,
              definition="hidden / total communication = (comm_us - exposed_comm_us) / comm_us: 1 = all hidden, "
                         "0 = none (serial), < 0 = the schedule adds more than it hides"),
    MetricDef(name="gemm_tflops_per_rank", unit="TFLOP/s", value=_gemm_tflops,
              definition="mean over ranks of the expert GEMM FLOPs (6 x pairs x hidden x intermediate) / gemm time"),
    MetricDef(name="gemm_slowdown", unit="ratio", value=_gemm_slowdown,
              definition="one micro-batch's GEMMs under the whole batch's dispatch+combine (concurrent, on another "
                         "stream) / the same GEMMs alone - 1: what the communication's SMs cost the GEMMs"),
)  # fmt: skip
LAYER_CHECK = (
    MetricDef(name="layer_rel_err", unit="ratio", value=lambda m: m.check.get("layer_err"),
              definition="max over ranks of ||out - ref|| / ||ref|| (float32 reference)"),
)  # fmt: skip
OVERLAP = (
    MetricDef(name="speedup_vs_serial", unit="ratio", value=_ratio_of("layer_serial", "layer"),
              definition="serial layer time / {mode} layer time (> 1: the overlap pays off)"),
    MetricDef(name="split_overhead_us", unit="us",
              value=lambda m: m.med["compute_only_split"] - m.med["compute_only"],
              definition="expert compute in {chunks} micro-batches - in one"),
)  # fmt: skip
BACKWARD = (
    MetricDef(name="tokens_per_s_per_rank_fwd_bwd", unit="tokens/s",
              value=lambda m: _tokens_per_s(m, "layer_fwd_bwd"),
              definition="tokens per rank / forward+backward layer time"),
)  # fmt: skip
GRAD_CHECK = (
    MetricDef(name="grad_x_rel_err", unit="ratio", value=lambda m: m.check.get("grad_x_err"),
              definition="max over ranks of the input gradient's relative error"),
    MetricDef(name="grad_w_rel_err", unit="ratio", value=lambda m: m.check.get("grad_w_err"),
              definition="max over ranks of the local expert weight gradients' relative error"),
)  # fmt: skip
OVERLAP_BACKWARD = (
    MetricDef(name="speedup_vs_serial_fwd_bwd", unit="ratio",
              value=_ratio_of("layer_fwd_bwd_serial", "layer_fwd_bwd"),
              definition="serial forward+backward time / {mode} forward+backward time"),
)  # fmt: skip


def metric_defs(settings: E2ESettings) -> tuple[MetricDef, ...]:
    """The metrics a case with these settings gets, in the order they are stored."""
    overlapped = settings.mode in OVERLAPPED
    if settings.profile == "layer":  # the other ops were not timed
        return LAYER + LAYER_CHECK + (BACKWARD if settings.backward else ())
    out = LAYER + COMM + LAYER_CHECK + (OVERLAP if overlapped else ())
    if settings.backward:
        out += BACKWARD + GRAD_CHECK + (OVERLAP_BACKWARD if overlapped else ())
    return out


def metric(name: str, value: float | None, unit: str, definition: str) -> dict[str, Any]:
    kept = float(value) if value is not None and math.isfinite(value) else None
    return {"name": name, "value": kept, "unit": unit, "definition": definition}


def e2e_metrics(
    ops: Mapping[str, Mapping[str, Any]],
    settings: E2ESettings,
    workload: Workload,
    pairs_per_rank: list[int],
    check: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Derived figures of one case from its gathered samples (medians of the slowest rank per iteration)."""
    med = {op: summarize(data["samples_us"]).median_us for op, data in ops.items()}
    inputs = MetricInputs(
        med=med, settings=settings, workload=workload, pairs_per_rank=pairs_per_rank, check=check
    )
    return [
        metric(
            d.name, d.value(inputs), d.unit, d.definition.format(mode=settings.mode, chunks=settings.chunks)
        )
        for d in metric_defs(settings)
    ]
