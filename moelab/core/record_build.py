"""From what the ranks measured to a CaseRecord: summaries, bandwidth figures, library figures, stability.

Runs on rank 0 of the job (or wherever a record is made), before anything is stored, so the record holds
every derived number and the store only stores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from moelab.core.bandwidth import bandwidths
from moelab.core.case_record import Figure, OpResult, RankKernelTime, Summary
from moelab.core.rows import RankRows
from moelab.core.stats import summarize

UNSTABLE_SPREAD = 0.5  # (p90 - p10) / median above this: the median is not a single mode's


@dataclass(frozen=True, kw_only=True, slots=True)
class OpMeasurement:
    """One op as the ranks timed it, before any summary."""

    op: str
    samples_us: Sequence[Sequence[float]]  # [rank][iteration]
    bytes_per_row: int
    noise: float | None = None
    noise_target: float | None = None
    host_sync: str | None = None
    kernel: Sequence[RankKernelTime | None] | None = None
    library_samples_us: Sequence[Sequence[float]] | None = None  # the library's own timing of this op


def summary_of(samples_us: Sequence[Sequence[float]], noise: float | None) -> Summary:
    finite = noise is not None and noise == noise and noise != float("inf")
    return replace(summarize(samples_us), noise=noise if finite else None)


def stability(m: OpMeasurement, s: Summary) -> str | None:
    """None when the op's median can be trusted, else the measured reason it cannot."""
    if s.median_us <= 0:
        return None
    reasons = []
    if m.noise is not None and m.noise_target is not None and m.noise > m.noise_target:
        reasons.append(
            f"median noise {m.noise:.1%} above the {m.noise_target:.0%} target after {s.n} iterations"
        )
    spread = (s.p90_us - s.p10_us) / s.median_us
    if spread > UNSTABLE_SPREAD:
        reasons.append(f"p10-p90 spread {spread:.0%} of the median (more than one mode)")
    if not reasons:
        return None
    if s.rank_spread_us / s.median_us > 0.2:
        reasons.append(
            f"ranks differ by {s.rank_spread_us / s.median_us:.0%} of the median (a rank waits on another)"
        )
    if m.host_sync:
        reasons.append(f"the op contains a host sync ({m.host_sync})")
    return "; ".join(reasons)


def op_result(
    m: OpMeasurement,
    rows: Sequence[RankRows],
    library_figures: Mapping[str, list[Figure]] | None = None,
) -> OpResult:
    """Summary, figures over the median (and over kernel-only time where traced), the library's own."""
    s = summary_of(m.samples_us, m.noise)
    figures: list[Figure] = []
    kernel_us = None
    if rows and m.bytes_per_row:
        figures += bandwidths(rows, m.bytes_per_row, s.median_us)
        kernel_values = [k.kernel_us for k in (m.kernel or []) if k is not None and k.kernel_us is not None]
        kernel_us = max(kernel_values) if kernel_values else None
        if kernel_us:
            figures += bandwidths(rows, m.bytes_per_row, kernel_us, source="kernel")
        figures += (library_figures or {}).get(m.op, [])
    return OpResult(
        op=m.op,
        samples_us=tuple(tuple(float(t) for t in r) for r in m.samples_us),
        bytes_per_row=m.bytes_per_row,
        summary=s,
        figures=tuple(figures),
        host_sync=m.host_sync,
        kernel=None if m.kernel is None else tuple(m.kernel),
        kernel_us=kernel_us,
        stability=stability(m, s),
        library_samples_us=None
        if m.library_samples_us is None
        else tuple(tuple(float(t) for t in r) for r in m.library_samples_us),
    )
