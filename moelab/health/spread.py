"""A case whose spread is far above a noise target or its own history: measured alone, an op's IQR/median
stays near its usual; far above it, something shared the machine or the op has a mode that wanders.

Pure rules on the rows the store reads after ingest (moelab.store.history.spread_flags): each op of the run
with the spreads of the same backend, case and op in earlier runs on the same GPU model.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NOISE_TARGET = 0.05  # IQR / median of a GPU case measured alone (nvbench's default stdrel is 0.5%)
FAR_ABOVE = 3.0  # a spread this many times the target, or the case's own history, is flagged
MIN_HISTORY = 3


@dataclass(frozen=True, slots=True)
class OpSpread:
    """One op of the run being judged, and its spreads in earlier runs of the same case and GPU model."""

    backend: str
    case_id: str
    op: str
    rel_iqr: float
    history: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SpreadFlag:
    backend: str
    case_id: str
    op: str
    rel_iqr: float
    reference: float  # the noise target or the history's median spread, whichever it was held against
    basis: str  # "target" or "history (N runs)"

    def reason(self) -> str:
        return (
            f"spread: {self.op} IQR/median {100 * self.rel_iqr:.1f}% is over {FAR_ABOVE:g}x its {self.basis} "
            f"({100 * self.reference:.1f}%)"
        )


def spread_flags(
    ops: Sequence[OpSpread], noise_target: float = NOISE_TARGET, far_above: float = FAR_ABOVE
) -> list[SpreadFlag]:
    """Ops whose IQR/median is more than `far_above` times their history's median (at least MIN_HISTORY
    earlier runs) or, without enough history, times `noise_target`."""
    out = []
    for o in ops:
        if len(o.history) >= MIN_HISTORY:
            reference, basis = statistics.median(o.history), f"history ({len(o.history)} runs)"
            reference = max(reference, noise_target / far_above)  # a near-zero history is not a bar
        else:
            reference, basis = noise_target, "noise target"
        if o.rel_iqr > far_above * reference:
            out.append(SpreadFlag(o.backend, o.case_id, o.op, float(o.rel_iqr), float(reference), basis))
    return out
