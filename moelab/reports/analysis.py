"""The report's derived numbers: the SM knee, the alpha/beta latency model, and fractions of a link peak.

Knee: the fewest SMs whose bandwidth reaches 95% of the best bandwidth over the SM sweep (per backend, op
and workload). It answers "how many SMs can I give this library before compute pays for nothing".

Alpha/beta: latency(bytes) = alpha + bytes / beta, fitted by least squares over the token sweep of one
backend and op. alpha is the fixed cost (launch, synchronisation), beta the asymptotic bandwidth. As
CollectiveX does, a fit with R^2 below 0.9 is withheld: a line through points that do not lie on a line
would print a confident beta that means nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KNEE_FRACTION = 0.95
MIN_R2 = 0.9
MIN_FIT_POINTS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Knee:
    sms: int  # fewest SMs reaching KNEE_FRACTION of the best
    gbps: float  # bandwidth at the knee
    best_sms: int
    best_gbps: float
    fraction: float = KNEE_FRACTION


def knee(points: Sequence[tuple[int, float]], fraction: float = KNEE_FRACTION) -> Knee | None:
    """points: (SMs, bandwidth). None when fewer than two SM counts were measured."""
    clean = sorted(
        (int(s), float(g)) for s, g in points if s is not None and g is not None and np.isfinite(g)
    )
    if len({s for s, _ in clean}) < 2:
        return None
    best_sms, best = max(clean, key=lambda p: (p[1], -p[0]))
    sms, gbps = next(p for p in clean if p[1] >= fraction * best)
    return Knee(sms=sms, gbps=gbps, best_sms=best_sms, best_gbps=best, fraction=fraction)


@dataclass(frozen=True, kw_only=True, slots=True)
class AlphaBeta:
    n: int
    alpha_us: float | None  # None when withheld
    beta_gbps: float | None
    r2: float | None
    withheld: str | None  # why the fit is not shown, or None

    @property
    def shown(self) -> bool:
        return self.withheld is None


def fit_alpha_beta(bytes_: Sequence[float], latency_us: Sequence[float], min_r2: float = MIN_R2) -> AlphaBeta:
    """Least-squares latency_us = alpha + bytes / (beta * 1e3), beta in GB/s."""
    pairs = [
        (float(b), float(t))
        for b, t in zip(bytes_, latency_us, strict=True)
        if b is not None and t is not None
    ]
    n = len(pairs)
    if len({b for b, _ in pairs}) < MIN_FIT_POINTS:
        return AlphaBeta(
            n=n, alpha_us=None, beta_gbps=None, r2=None, withheld=f"fewer than {MIN_FIT_POINTS} sizes"
        )
    x = np.array([b for b, _ in pairs])
    y = np.array([t for _, t in pairs])
    slope, intercept = np.polyfit(x, y, 1)
    pred = intercept + slope * x
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    if slope <= 0:
        return AlphaBeta(
            n=n, alpha_us=None, beta_gbps=None, r2=r2, withheld="latency does not grow with bytes"
        )
    if r2 < min_r2:
        return AlphaBeta(n=n, alpha_us=None, beta_gbps=None, r2=r2, withheld=f"R² {r2:.3f} < {min_r2}")
    # slope is µs per byte: bytes/µs = 1/slope; GB/s = bytes/µs * 1e6 / 1e9
    return AlphaBeta(n=n, alpha_us=float(intercept), beta_gbps=float(1e-3 / slope), r2=r2, withheld=None)


def fraction_of_peak(gbps: float | None, peak_gbps: float | None) -> float | None:
    if gbps is None or peak_gbps is None or peak_gbps <= 0 or not np.isfinite(gbps):
        return None
    return gbps / peak_gbps
