"""What `moelab tune` searches: candidates (backend, schedule, communication SMs, backend knobs), the coarse
grid it starts from, and the neighbours it refines a survivor with.

SM counts are even (DeepEP V1 runs one channel per two SMs and asserts on odd counts; the others take
any count) and only searched where the backend can set them (on CPU ranks, gloo has no SM control: the
search is then over backends, schedules and knobs). Knob variants are each library's chunk and queue
sizes, declared by its backend (`tuning`, a moelab.backends.tuning.TuneSpace): e.g. DeepEP V1's NVL chunk
sizes, Hybrid-EP's separate combine SM count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moelab.backends import registry
from moelab.backends.base import Backend
from moelab.backends.tuning import TuneSpace, even_sms

SCHEDULES = ("serial", "tbo")
COARSE_SMS = (8, 16, 32, 64)


def tuning_of(backend: str) -> TuneSpace | None:
    """What `backend` declares tune may vary and emit (None: schedules and SMs alone)."""
    cls = registry.load(backend)
    return cls.tuning if issubclass(cls, Backend) else None


def tunable_backends() -> tuple[str, ...]:
    """The backends tune searches when --backend is not given: those that declare a tune space, in the
    registry's order."""
    return tuple(
        name for name, cls in registry.declared() if issubclass(cls, Backend) and cls.tuning is not None
    )


def default_dtypes() -> dict[str, str]:
    """The dispatch payload each backend is tuned with unless --dtype is given (others: the workload's)."""
    spaces = {name: cls.tuning for name, cls in registry.declared() if issubclass(cls, Backend)}
    return {name: t.dtype for name, t in spaces.items() if t is not None and t.dtype is not None}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration to time; knobs as sorted (name, value) pairs so candidates compare and hash."""

    backend: str
    mode: str
    sms: int | None  # None: the library's default
    knobs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def make(
        cls, backend: str, mode: str, sms: int | None, knobs: Mapping[str, Any] | None = None
    ) -> Candidate:
        return cls(backend, mode, sms, tuple(sorted((knobs or {}).items())))

    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    def describe(self) -> str:
        parts = [self.backend, self.mode, f"sms={self.sms if self.sms is not None else 'default'}"]
        parts += [f"{k}={v}" for k, v in self.knobs]
        return " ".join(parts)


def default_candidate(backend: str) -> Candidate:
    """What a user gets without tuning: the library's default SMs and knobs, the serial layer."""
    return Candidate.make(backend, "serial", None)


def coarse(
    backends: Sequence[str], sms_grid: Sequence[int], sm_control: bool, schedules: Sequence[str] = SCHEDULES
) -> list[Candidate]:
    """Round one: every backend x schedule at the library default and at each SM count of the grid."""
    sms: list[int | None] = [None, *(sms_grid if sm_control else ())]
    return [Candidate.make(b, m, s) for b in backends for m in schedules for s in sms]


def sm_neighbours(sms: int | None, grid: Sequence[int]) -> list[int]:
    """Even SM counts halfway between `sms` and its neighbours on the grid (the library default has none)."""
    if sms is None or not grid:
        return []
    ordered = sorted(set(grid) | {sms})
    i = ordered.index(sms)
    out = []
    if i > 0:
        out.append(even_sms((ordered[i - 1] + sms) / 2))
    if i + 1 < len(ordered):
        out.append(even_sms((ordered[i + 1] + sms) / 2))
    return [s for s in out if s != sms]


def knob_variants(c: Candidate) -> list[dict[str, Any]]:
    """The backend's chunk/queue settings to try at a survivor's SM count (beyond the library's defaults)."""
    tuning = tuning_of(c.backend)
    return tuning.knob_variants(c.sms) if tuning is not None else []


def refine(survivors: Iterable[Candidate], grid: Sequence[int], sm_control: bool) -> list[Candidate]:
    """Round two: each survivor again, at the SM counts next to it, and with each knob variant."""
    out: list[Candidate] = []
    for c in survivors:
        out.append(c)
        if sm_control:
            out += [Candidate(c.backend, c.mode, s, c.knobs) for s in sm_neighbours(c.sms, grid)]
        out += [Candidate.make(c.backend, c.mode, c.sms, {**c.knob_dict(), **v}) for v in knob_variants(c)]
    return list(dict.fromkeys(out))  # de-duplicated, order kept
