"""What `moelab tune` searches: candidates (backend, schedule, communication SMs, backend knobs), the coarse
grid it starts from, and the neighbours it refines a survivor with.

SM counts are even (DeepEP V1 runs one channel per two SMs and asserts on odd counts; the others take
any count) and only searched where the backend can set them (on CPU ranks, gloo has no SM control: the
search is then over backends, schedules and knobs). Knob variants are each library's chunk and queue
sizes: DeepEP V1's NVL chunk sizes (Config's num_max_nvl_chunked_send_tokens for dispatch and combine;
DeepEP's own tuning sweeps them), Hybrid-EP's separate combine SM count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TUNABLE_BACKENDS = ("nccl-a2a", "mxfp8-a2a", "deepep", "hybrid-ep")
SCHEDULES = ("serial", "tbo")
COARSE_SMS = (8, 16, 32, 64)
DEFAULT_DTYPES = {
    "mxfp8-a2a": "mxfp8",
    "deepep": "fp8",
}  # as the e2e suite: DeepEP V1 bf16 traps at hidden 8192


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


def coarse(backends: Sequence[str], sms_grid: Sequence[int], sm_control: bool) -> list[Candidate]:
    """Round one: every backend x schedule at the library default and at each SM count of the grid."""
    sms: list[int | None] = [None, *(sms_grid if sm_control else ())]
    return [Candidate.make(b, m, s) for b in backends for m in SCHEDULES for s in sms]


def _even(n: float) -> int:
    return max(2, int(round(n / 2)) * 2)


def sm_neighbours(sms: int | None, grid: Sequence[int]) -> list[int]:
    """Even SM counts halfway between `sms` and its neighbours on the grid (the library default has none)."""
    if sms is None or not grid:
        return []
    ordered = sorted(set(grid) | {sms})
    i = ordered.index(sms)
    out = []
    if i > 0:
        out.append(_even((ordered[i - 1] + sms) / 2))
    if i + 1 < len(ordered):
        out.append(_even((ordered[i + 1] + sms) / 2))
    return [s for s in out if s != sms]


def knob_variants(c: Candidate) -> list[dict[str, Any]]:
    """The backend's chunk/queue settings to try at a survivor's SM count (beyond the library's defaults)."""
    if c.backend == "deepep":
        return [{"nvl_chunk": 12}, {"nvl_chunk": 32}, {"combine_nvl_chunk": 4}, {"combine_nvl_chunk": 16}]
    if c.backend == "hybrid-ep" and c.sms is not None:
        return [{"combine_sms": s} for s in (_even(c.sms / 2), _even(c.sms * 1.5)) if s != c.sms]
    return []


def refine(survivors: Iterable[Candidate], grid: Sequence[int], sm_control: bool) -> list[Candidate]:
    """Round two: each survivor again, at the SM counts next to it, and with each knob variant."""
    out: list[Candidate] = []
    for c in survivors:
        out.append(c)
        if sm_control:
            out += [Candidate(c.backend, c.mode, s, c.knobs) for s in sm_neighbours(c.sms, grid)]
        out += [Candidate.make(c.backend, c.mode, c.sms, {**c.knob_dict(), **v}) for v in knob_variants(c)]
    return list(dict.fromkeys(out))  # de-duplicated, order kept
