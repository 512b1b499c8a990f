"""Measured link figures of a run (RUN_DIR/peaks.json): the type, and writing it, without torch (moelab.job.rundir
reads it back as data)."""

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
