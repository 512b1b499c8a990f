"""The e2e layer's roofline: the least time one rank's layer could take on this GPU.

    roofline = GEMM FLOPs / measured dense bf16 matmul rate
             + the bytes the non-GEMM steps must move / measured HBM copy rate
             + dispatch + combine, at their measured times

The rates are measured once per GPU run (moelab.measure.peaks.measure_device_rates, RUN_DIR/rates.json);
without them (a CPU run, `peaks` off) nothing is formed and the metrics say why. Per rank with P (row,
expert) pairs, R received rows, hidden H, expert width I, 2-byte (bf16) activations:

- GEMM FLOPs: forward 6·P·H·I (fc1 [H, 2I] and fc2 [I, H]); forward+backward three times that (the input
  and the weight gradient of each GEMM).
- non-GEMM bytes, forward: permute (read R rows, write P) + SwiGLU (read [P, 2I], write [P, I]) +
  un-permute (read P pairs, write R rows) = 2·(2·(R+P)·H + 3·P·I); backward adds the un-permute's
  gradient (read R, write P), SwiGLU's (read [P, 2I] and [P, I], write [P, 2I]) and the permute's
  (read P, write R): 2·(2·(R+P)·H + 5·P·I).
- communication: the forward's dispatch and combine; forward+backward twice them (the backward's
  combine of the input gradient and dispatch of the output gradient move the same rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moelab.core.peaks import MeasuredRate
from moelab.job.rundir import RunDir

ACT_BYTES = 2  # bf16 activations, whatever the dispatch payload
MATMUL_RATE = "dense_bf16_matmul"
SUSTAINED_MATMUL_RATE = "dense_bf16_matmul_sustained"  # runs before round 20 have none
COPY_RATE = "hbm_copy"


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRates:
    matmul_tflops: float  # dense bf16 matmul, TFLOP/s
    copy_gbps: float  # HBM copy, bytes read + written per second / 1e9
    matmul_sustained_tflops: float | None = None  # the same back to back, at the power limit


def rates_from(measured: Sequence[MeasuredRate]) -> DeviceRates | None:
    by_name = {r.name: r.value for r in measured}
    if MATMUL_RATE not in by_name or COPY_RATE not in by_name:
        return None
    return DeviceRates(
        matmul_tflops=by_name[MATMUL_RATE],
        copy_gbps=by_name[COPY_RATE],
        matmul_sustained_tflops=by_name.get(SUSTAINED_MATMUL_RATE),
    )


def run_rates(run_dir: Path | None) -> tuple[DeviceRates | None, str]:
    """The run's measured rates, or None and why there are none."""
    if run_dir is None:
        return None, "no run directory to read measured rates from"
    rates = rates_from(RunDir(run_dir).rates())
    if rates is None:
        return None, "this run measured no GPU rates (a CPU run, or peaks not measured)"
    return rates, ""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerWork:
    """What one rank's layer must compute and move."""

    pairs: int
    rows: int
    hidden: int
    intermediate: int

    def gemm_flops(self, backward: bool) -> float:
        return (18.0 if backward else 6.0) * self.pairs * self.hidden * self.intermediate

    def activation_bytes(self, backward: bool) -> float:
        return ACT_BYTES * (8 if backward else 3) * self.pairs * self.intermediate

    def permute_bytes(self, backward: bool) -> float:
        """Permute and un-permute (and, with backward, their gradients)."""
        return ACT_BYTES * 2 * (self.rows + self.pairs) * self.hidden * (2 if backward else 1)

    def non_gemm_bytes(self, backward: bool) -> float:
        return self.permute_bytes(backward) + self.activation_bytes(backward)

    def gemm_floor_us(self, rates: DeviceRates, backward: bool) -> float:
        return self.gemm_flops(backward) / (rates.matmul_tflops * 1e12) * 1e6

    def bytes_floor_us(self, nbytes: float, rates: DeviceRates) -> float:
        return nbytes / (rates.copy_gbps * 1e9) * 1e6

    def compute_floor_us(self, rates: DeviceRates, backward: bool) -> float:
        """GEMMs at the matmul rate plus the non-GEMM bytes at the copy rate."""
        return self.gemm_floor_us(rates, backward) + self.bytes_floor_us(self.non_gemm_bytes(backward), rates)


def busiest(works: Sequence[LayerWork], rates: DeviceRates, backward: bool) -> LayerWork:
    """The rank whose compute floor is highest: the layer waits for it."""
    return max(works, key=lambda w: w.compute_floor_us(rates, backward))
