"""Measured figures of a run, without torch: link peaks (RUN_DIR/peaks.json) and the GPU's dense matmul and
memory copy rates (RUN_DIR/rates.json): the types, and writing them (moelab.job.rundir reads them back as
data)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredPeak:
    name: str  # peer_copy_shift1, a2a_algbw, a2a_remote
    gbps: float
    bytes: int  # per rank
    definition: str


def write_peaks(path: Path, peaks: list[MeasuredPeak]) -> None:
    path.write_text(json.dumps([asdict(p) for p in peaks], indent=2))


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredRate:
    """One GPU's achievable compute or memory rate (RUN_DIR/rates.json): the e2e layer's roofline."""

    name: str  # dense_bf16_matmul, hbm_copy
    value: float
    unit: str  # TFLOP/s, GB/s
    work: float  # FLOPs or bytes of one timed call
    definition: str


def write_rates(path: Path, rates: list[MeasuredRate]) -> None:
    path.write_text(json.dumps([asdict(r) for r in rates], indent=2))
