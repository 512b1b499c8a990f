"""gather-ep with each of the three mistakes `moelab backends --check` catches before any run (test-only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gather_ep import FIGURE, GatherBackend, GatherKnobs, OwnBench
from moelab.plugin import Comparison, Knobs, VerifyConfig, knob


class DispatchOpBench(OwnBench):
    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        return [
            Comparison(op="dispatch", library_dtype=d, moelab_dtype=d, figure=FIGURE) for d in config.dtypes
        ]


class DispatchOps(GatherBackend):
    """Names `dispatch`, which a backend timed whole never has (it has dispatch_fresh, combine, roundtrip)."""

    name = "gather-ep-dispatch"
    library_ops: ClassVar[tuple[str, ...]] = ("dispatch",)
    library_test = DispatchOpBench()


@dataclass(frozen=True, kw_only=True)
class ChunkedKnobs(GatherKnobs):
    chunks: int = knob(1, "rows per exchange, in chunks")


class ReservedKnob(GatherBackend):
    """A knob named `chunks`: the e2e layer's (E2E_KEYS), so the backend would never see it."""

    name = "gather-ep-chunks"
    knobs: ClassVar[type[Knobs]] = ChunkedKnobs


class DerivedBench(OwnBench):
    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        return [
            Comparison(
                op="dispatch_fresh",
                library_dtype=d,
                moelab_dtype=d,
                figure="gather_ep_library_bytes",
                moelab_side="library_bytes",
                time_ops=("dispatch_fresh",),
            )
            for d in config.dtypes
        ]


class UndefinedFigure(GatherBackend):
    """Compares a figure verify derives (the library's bytes over moelab's time) but defines it nowhere."""

    name = "gather-ep-undefined"
    library_test = DerivedBench()
