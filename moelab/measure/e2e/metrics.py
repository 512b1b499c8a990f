"""The derived figures of one e2e case, as a table of metric definitions over the ops' medians.

Every figure is a median of the slowest rank per iteration (moelab.core.stats.summarize), kept with
its unit and a definition that says how it was made; a figure that cannot be formed (a zero time) is
stored as None. Which metrics a case gets depends on its settings: `profile = layer` timed the layer
alone, the overlapped modes add the comparison with the serial layer, `backward` the forward+backward
figures and gradient errors. The roofline figures (moelab.measure.e2e.roofline) need this GPU's measured
matmul and copy rates: without them they are stored as None, their definition saying why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moelab.core.e2e_spec import E2ESettings
from moelab.core.stats import summarize
from moelab.core.workload import Workload
from moelab.measure.e2e.roofline import DeviceRates, LayerWork, busiest


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricInputs:
    """What a metric is computed from: the ops' medians (µs) and the case that timed them."""

    med: Mapping[str, float]
    settings: E2ESettings
    workload: Workload
    pairs_per_rank: Sequence[int]
    check: Mapping[str, Any]
    rows_per_rank: Sequence[int] = ()
    rates: DeviceRates | None = None
    half_spread: Mapping[str, float] = field(default_factory=dict)  # op -> (p90 - p10) / 2, µs
    sms_taken: int | None = None  # SMs the schedule takes from the GEMMs (schedules.sms_taken_from_gemms)

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

    def work(self, backward: bool) -> LayerWork:
        """The busiest rank's pairs and received rows (needs `rates`)."""
        assert self.rates is not None
        works = [
            LayerWork(pairs=p, rows=r, hidden=self.workload.hidden, intermediate=self.settings.intermediate)
            for p, r in zip(self.pairs_per_rank, self.rows_per_rank, strict=True)
        ]
        return busiest(works, self.rates, backward)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricDef:
    name: str
    unit: str
    definition: str  # a template: {mode} and {chunks} are the case's
    value: Callable[[MetricInputs], float | None]
    needs_rates: bool = False  # a roofline figure: None, with the reason, where the run measured no rates
    # the physical range of a ratio against a floor made of measured rates: a reading outside it is a timing
    # or accounting artefact, stored as None with the reading and the bound in its definition, never as a figure
    at_least: float | None = None
    at_most: float | None = None

    def outside(self, value: float | None) -> str | None:
        """Why `value` is no figure of this metric (outside its physical range), or None."""
        if value is None or not math.isfinite(value):
            return None
        if self.at_least is not None and value < self.at_least:
            return f"read {value:.3g}, below its physical floor of {self.at_least:g}"
        if self.at_most is not None and value > self.at_most:
            return f"read {value:.3g}, above its physical bound of {self.at_most:g}"
        return None


def _tokens_per_s(m: MetricInputs, op: str) -> float | None:
    t = m.med[op]
    return m.workload.tokens_per_rank / (t * 1e-6) if t > 0 else None


def _overlap_efficiency(m: MetricInputs) -> float | None:
    comm = m.comm
    return (comm - m.exposed) / comm if comm > 0 else None


def _gemm_tflops(m: MetricInputs) -> float | None:
    gemm = m.med["gemm"]
    return m.flops_per_rank / (gemm * 1e-6) / 1e12 if gemm > 0 else None


def _gemm_share_of_sustained(m: MetricInputs) -> float | None:
    tflops = _gemm_tflops(m)
    sustained = m.rates.matmul_sustained_tflops if m.rates else None
    return tflops / sustained if tflops is not None and sustained else None


def _gemm_slowdown(m: MetricInputs) -> float | None:
    alone = m.med["gemm_mb"]
    return m.med["gemm_mb_under_comm"] / alone - 1.0 if alone > 0 else None


def _ratio_of(num_op: str, den_op: str) -> Callable[[MetricInputs], float | None]:
    def ratio(m: MetricInputs) -> float | None:
        den = m.med[den_op]
        return m.med[num_op] / den if den > 0 else None

    return ratio


def _share(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _compute_floor(m: MetricInputs, backward: bool) -> float:
    assert m.rates is not None
    return m.work(backward).compute_floor_us(m.rates, backward)


def _gemm_op_floor(m: MetricInputs) -> float:
    """The `gemm` op's least time: the GEMMs at the matmul rate, the activation's bytes at the copy rate."""
    assert m.rates is not None
    w = m.work(False)
    return w.gemm_floor_us(m.rates, False) + w.bytes_floor_us(w.activation_bytes(False), m.rates)


def _permute_over_floor(m: MetricInputs) -> float | None:
    """The `permute` op (grouping and un-permute, timed directly) over the time its bytes take at the copy
    rate. Not compute_only - gemm: compute_only holds only the un-permute (the grouping runs in the layer's
    dispatch step), and a difference of two medians is no figure of a kernel that costs less than their
    noise (it read 0.33-0.88 at EP = 2, below its own floor)."""
    assert m.rates is not None
    if "permute" not in m.med:
        return None
    w = m.work(False)
    return _share(m.med["permute"], w.bytes_floor_us(w.permute_bytes(False), m.rates))


def _compute_only_floor(m: MetricInputs) -> float:
    """compute_only's least time: the GEMMs, SwiGLU's bytes and the un-permute's (half the permute bytes:
    read P pairs, write R rows), the grouping not being part of it."""
    assert m.rates is not None
    w = m.work(False)
    moved = w.activation_bytes(False) + w.permute_bytes(False) / 2
    return w.gemm_floor_us(m.rates, False) + w.bytes_floor_us(moved, m.rates)


LAYER = (
    MetricDef(
        name="layer_us",
        unit="us",
        value=lambda m: m.layer,
        definition="median forward layer time ({mode}), slowest rank per iteration",
    ),
    MetricDef(
        name="tokens_per_s_per_rank",
        unit="tokens/s",
        value=lambda m: _tokens_per_s(m, "layer"),
        definition="tokens per rank / layer time",
    ),
)
COMM = (
    MetricDef(
        name="comm_us",
        unit="us",
        value=lambda m: m.comm,
        definition="dispatch + combine, each timed alone on the whole batch",
    ),
    MetricDef(
        name="exposed_comm_us",
        unit="us",
        value=lambda m: m.exposed,
        definition="time the expert compute waits: layer time - compute_only time (expert compute alone, "
        "whole batch)",
    ),
    MetricDef(
        name="exposed_comm_share",
        unit="ratio",
        value=lambda m: m.exposed / m.layer if m.layer > 0 else None,
        definition="exposed_comm_us / layer_us",
    ),
    MetricDef(
        name="overlap_efficiency",
        unit="ratio",
        value=_overlap_efficiency,
        definition="hidden / total communication = (comm_us - exposed_comm_us) / comm_us: 1 = all hidden, "
        "0 = none (serial), < 0 = the schedule adds more than it hides",
    ),
    MetricDef(
        name="gemm_tflops_per_rank",
        unit="TFLOP/s",
        value=_gemm_tflops,
        definition="mean over ranks of the expert GEMM FLOPs (6 x pairs x hidden x intermediate) / gemm time",
    ),
    MetricDef(
        name="gemm_slowdown",
        unit="ratio",
        value=_gemm_slowdown,
        definition="one micro-batch's GEMMs under the whole batch's dispatch+combine (concurrent, on another "
        "stream) / the same GEMMs alone - 1: what the communication's SMs cost the GEMMs",
    ),
)
ROOFLINE = (
    MetricDef(
        name="dense_matmul_tflops",
        unit="TFLOP/s",
        needs_rates=True,
        value=lambda m: m.rates.matmul_tflops if m.rates else None,
        definition="this GPU's dense bf16 matmul rate, measured once per run (table measured_rates)",
    ),
    MetricDef(
        name="dense_matmul_sustained_tflops",
        unit="TFLOP/s",
        needs_rates=True,
        value=lambda m: m.rates.matmul_sustained_tflops if m.rates else None,
        definition="the same matmul back to back for about a second: its rate at the GPU's power limit, "
        "measured once per run (table measured_rates; none in runs before round 20)",
    ),
    MetricDef(
        name="gemm_share_of_sustained_matmul",
        unit="ratio",
        needs_rates=True,
        value=_gemm_share_of_sustained,
        definition="gemm_tflops_per_rank / dense_matmul_sustained_tflops: the expert GEMMs against a dense "
        "matmul in the power state a long layer runs in (no bound: a short run at boost clocks may pass 1)",
    ),
    MetricDef(
        name="hbm_copy_gbps",
        unit="GB/s",
        needs_rates=True,
        value=lambda m: m.rates.copy_gbps if m.rates else None,
        definition="this GPU's device-to-device copy rate (bytes read + written), measured once per run",
    ),
    MetricDef(
        name="gemm_roofline_share",
        unit="ratio",
        needs_rates=True,
        value=lambda m: _share(_gemm_op_floor(m), m.med["gemm"]),
        at_most=1.0,
        definition="(GEMM FLOPs / dense_matmul_tflops + SwiGLU bytes / hbm_copy_gbps) / gemm time, busiest "
        "rank: 1 = the grouped GEMMs at the dense matmul rate",
    ),
    MetricDef(
        name="permute_over_floor",
        unit="ratio",
        needs_rates=True,
        value=_permute_over_floor,
        at_least=1.0,
        definition="permute time (grouping: pair map, permute; un-permute: weighted sum per row; timed "
        "directly) / (their bytes / hbm_copy_gbps), busiest rank: 1 = at copy speed",
    ),
    MetricDef(
        name="compute_roofline_us",
        unit="us",
        needs_rates=True,
        value=lambda m: _compute_floor(m, False),
        definition="GEMM FLOPs / dense_matmul_tflops + non-GEMM bytes (permute, SwiGLU, un-permute) / "
        "hbm_copy_gbps, busiest rank (moelab.measure.e2e.roofline)",
    ),
    MetricDef(
        name="compute_roofline_share",
        unit="ratio",
        needs_rates=True,
        value=lambda m: _share(_compute_only_floor(m), m.med["compute_only"]),
        at_most=1.0,
        definition="(GEMM FLOPs / dense_matmul_tflops + SwiGLU and un-permute bytes / hbm_copy_gbps) / "
        "compute_only time: the expert compute's % of roofline (the grouping runs in the dispatch step)",
    ),
    MetricDef(
        name="roofline_us",
        unit="us",
        needs_rates=True,
        value=lambda m: _compute_floor(m, False) + m.comm,
        definition="compute_roofline_us + dispatch + combine (each timed alone)",
    ),
    MetricDef(
        name="roofline_share",
        unit="ratio",
        needs_rates=True,
        value=lambda m: _share(_compute_floor(m, False) + m.comm, m.layer),
        definition="roofline_us / layer time ({mode}): the layer's % of roofline",
    ),
)
LAYER_CHECK = (
    MetricDef(
        name="layer_rel_err",
        unit="ratio",
        value=lambda m: m.check.get("layer_err"),
        definition="max over ranks of ||out - ref|| / ||ref|| (float32 reference)",
    ),
)
OVERLAP = (
    MetricDef(
        name="sms_taken_from_gemms",
        unit="SMs",
        value=lambda m: m.sms_taken,
        definition="SMs the {schedule} schedule takes from the expert GEMMs while communication runs "
        "beside them: the carve-out or partition; 0 where the communication holds none; none where not fixed "
        "(shared SMs at the library's default)",
    ),
    MetricDef(
        name="speedup_vs_serial",
        unit="ratio",
        value=_ratio_of("layer_serial", "layer"),
        definition="serial layer time / {mode} layer time, medians of iterations timed interleaved "
        "(> 1: the overlap pays off), the serial layer's communication at this case's SMs (against the "
        "fastest serial layer of any SM count: the report's vs best serial)",
    ),
    MetricDef(
        name="serial_exposed_comm_share",
        unit="ratio",
        value=lambda m: _share(m.med["layer_serial"] - m.med["compute_only"], m.med["layer_serial"]),
        definition="(serial layer - compute_only time) / serial layer, timed in this case: the share of the "
        "serial layer an overlap could hide (issue 37: where >= 10%, the best schedule should gain half of it)",
    ),
    MetricDef(
        name="split_overhead_us",
        unit="us",
        value=lambda m: m.med["compute_only_split"] - m.med["compute_only"],
        definition="expert compute in {chunks} micro-batches - in one",
    ),
    MetricDef(
        name="split_overhead_share",
        unit="ratio",
        value=lambda m: _share(m.med["compute_only_split"] - m.med["compute_only"], m.med["compute_only"]),
        definition="split_overhead_us / compute_only time: what splitting into {chunks} costs the expert "
        "compute (smaller GEMMs, more launches)",
    ),
    MetricDef(
        name="schedule_overhead_us",
        unit="us",
        value=lambda m: (
            m.layer - m.med["layer_serial"] - (m.med["compute_only_split"] - m.med["compute_only"])
        ),
        definition="({mode} layer - serial layer) - split_overhead_us: what the overlapped schedule adds beyond "
        "its split (streams, events, host syncs) less the communication it hides",
    ),
)
BACKWARD = (
    MetricDef(
        name="tokens_per_s_per_rank_fwd_bwd",
        unit="tokens/s",
        value=lambda m: _tokens_per_s(m, "layer_fwd_bwd"),
        definition="tokens per rank / forward+backward layer time",
    ),
)
GRAD_CHECK = (
    MetricDef(
        name="grad_x_rel_err",
        unit="ratio",
        value=lambda m: m.check.get("grad_x_err"),
        definition="max over ranks of the input gradient's relative error",
    ),
    MetricDef(
        name="grad_w_rel_err",
        unit="ratio",
        value=lambda m: m.check.get("grad_w_err"),
        definition="max over ranks of the local expert weight gradients' relative error",
    ),
)
ROOFLINE_BACKWARD = (
    MetricDef(
        name="roofline_us_fwd_bwd",
        unit="us",
        needs_rates=True,
        value=lambda m: _compute_floor(m, True) + 2 * m.comm,
        definition="forward+backward: GEMM FLOPs (3x forward) / dense_matmul_tflops + non-GEMM bytes / "
        "hbm_copy_gbps + 2 x (dispatch + combine)",
    ),
    MetricDef(
        name="roofline_share_fwd_bwd",
        unit="ratio",
        needs_rates=True,
        value=lambda m: _share(_compute_floor(m, True) + 2 * m.comm, m.med["layer_fwd_bwd"]),
        definition="roofline_us_fwd_bwd / forward+backward layer time ({mode})",
    ),
)
OVERLAP_BACKWARD = (
    MetricDef(
        name="speedup_vs_serial_fwd_bwd",
        unit="ratio",
        value=_ratio_of("layer_fwd_bwd_serial", "layer_fwd_bwd"),
        definition="serial forward+backward time / {mode} forward+backward time, medians of iterations "
        "timed interleaved, the serial layer's communication at this case's SMs",
    ),
)

# every metric whose reading has a physical range (at_least / at_most), by name: what a stored value is held to
BOUNDED = {
    d.name: d
    for d in LAYER
    + COMM
    + ROOFLINE
    + LAYER_CHECK
    + OVERLAP
    + BACKWARD
    + GRAD_CHECK
    + ROOFLINE_BACKWARD
    + OVERLAP_BACKWARD
    if d.at_least is not None or d.at_most is not None
}


def metric_defs(settings: E2ESettings) -> tuple[MetricDef, ...]:
    """The metrics a case with these settings gets, in the order they are stored."""
    overlapped = settings.compares_serial
    if settings.profile == "layer":  # the other ops were not timed
        return LAYER + LAYER_CHECK + (BACKWARD if settings.backward else ())
    out = LAYER + COMM + LAYER_CHECK + (OVERLAP if overlapped else ())
    if settings.backward:
        out += BACKWARD + GRAD_CHECK + (OVERLAP_BACKWARD if overlapped else ())
    return out + ROOFLINE + (ROOFLINE_BACKWARD if settings.backward else ())


def metric(name: str, value: float | None, unit: str, definition: str) -> dict[str, Any]:
    kept = float(value) if value is not None and math.isfinite(value) else None
    return {"name": name, "value": kept, "unit": unit, "definition": definition}


def e2e_metrics(
    ops: Mapping[str, Mapping[str, Any]],
    settings: E2ESettings,
    workload: Workload,
    pairs_per_rank: list[int],
    check: Mapping[str, Any],
    *,
    rows_per_rank: Sequence[int] = (),
    rates: DeviceRates | None = None,
    no_rates_reason: str = "no measured GPU rates",
    sms_taken: int | None = None,
) -> list[dict[str, Any]]:
    """Derived figures of one case from its gathered samples (medians of the slowest rank per iteration);
    the roofline's from `rates` and each rank's received rows, or None with `no_rates_reason`."""
    summaries = {op: summarize(data["samples_us"]) for op, data in ops.items()}
    med = {op: s.median_us for op, s in summaries.items()}
    half_spread = {op: (s.p90_us - s.p10_us) / 2 for op, s in summaries.items()}
    usable = rates if rates is not None and len(rows_per_rank) == len(pairs_per_rank) else None
    inputs = MetricInputs(
        med=med,
        settings=settings,
        workload=workload,
        pairs_per_rank=pairs_per_rank,
        check=check,
        rows_per_rank=rows_per_rank,
        rates=usable,
        half_spread=half_spread,
        sms_taken=sms_taken,
    )
    out = []
    for d in metric_defs(settings):
        definition = d.definition.format(
            mode=settings.mode, chunks=settings.chunks, schedule=settings.schedule
        )
        if d.needs_rates and usable is None:
            out.append(metric(d.name, None, d.unit, f"{definition}; not formed: {no_rates_reason}"))
            continue
        value = d.value(inputs)
        outside = d.outside(value)
        if outside:
            note = f"{definition}; not formed: {outside} (a timing or byte-accounting artefact, not a figure)"
            out.append(metric(d.name, None, d.unit, note))
        else:
            out.append(metric(d.name, value, d.unit, definition))
    return out
