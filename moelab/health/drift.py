"""Run-to-run drift: an op whose median moved between two runs of the same case on the same machine and
software is not a figure a user can trust, however tight each run was on its own.

Within one run the noise rule (TimingSpec.noise_target) and the spread rule (health.contention) catch an op
that wanders; an op that settles into a different mode in each run (a host sync inside the op, timed by
how fast the host thread wakes) looks stable in both. So after each ingest, every op is held against the
latest earlier run of the same backend, case and op with the same host, GPU model, driver, CUDA, NCCL,
torch and library versions: a median more than DRIFT_TOLERANCE away marks the op `unstable` in both runs,
each naming the other, and the new run's case `suspect`. A changed fingerprint is never drift: that is
what `moelab check` and `moelab compare` are for.

Pure rules on the rows the store reads after ingest (moelab.store.history.drift_flags): each op of the run
with its previous run of the same case and fingerprint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DRIFT_TOLERANCE = 0.05
JUDGED_DEVICES = (
    "cuda",
)  # drift and spread are judged on GPU runs only (timings over gloo are for function)


@dataclass(frozen=True, slots=True)
class Drift:
    backend: str
    case_id: str
    op: str
    median_us: float
    previous_run: str
    previous_median_us: float

    @property
    def change(self) -> float:
        return self.median_us / self.previous_median_us - 1.0

    def reason(self, other_run: str, change: float) -> str:
        return (
            f"median {100 * change:+.1f}% from run {other_run}'s (same case, host, GPU and software): "
            "this op's median moves between runs"
        )


@dataclass(frozen=True, slots=True)
class OpMedian:
    """One op of the run being judged, and the latest earlier run of the same case and fingerprint."""

    backend: str
    case_id: str
    op: str
    median_us: float
    previous_run: str | None  # None: no earlier run to hold it against
    previous_median_us: float | None


def drift_flags(ops: Sequence[OpMedian], tolerance: float = DRIFT_TOLERANCE) -> list[Drift]:
    """Ops whose median is more than `tolerance` away from their previous run's."""
    out = []
    for o in ops:
        if o.previous_run is None or o.previous_median_us is None:
            continue
        drift = Drift(o.backend, o.case_id, o.op, o.median_us, o.previous_run, o.previous_median_us)
        if abs(drift.change) > tolerance:
            out.append(drift)
    return out


def not_judged_reason(
    run_id: str,
    device: str,
    ops: Sequence[OpMedian],
    devices: Sequence[str] = JUDGED_DEVICES,
    exact: bool = True,
) -> str | None:
    """Why a run's medians were not (all) held against an earlier run, in one line; None when every
    measured op was. Not `exact` (`ops` holds host jobs too): only a run none of whose ops was held is said."""
    if device not in devices:
        return (
            f"run {run_id}: drift between runs not judged: a {device} run (timings over gloo are for "
            "function; drift and spread are judged on GPU runs only)"
        )
    alone = sum(1 for o in ops if o.previous_run is None)
    if not ops or not alone or (not exact and alone < len(ops)):
        return None
    if alone == len(ops):
        return (
            f"run {run_id}: drift between runs not judged: no earlier run of these cases with the same host, "
            "GPU, driver, CUDA, NCCL, torch and libraries"
        )
    return (
        f"run {run_id}: drift between runs judged for {len(ops) - alone} of {len(ops)} ops; the others have "
        "no earlier run with the same host, GPU and software"
    )
