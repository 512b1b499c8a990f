"""What `moelab tune` may vary for a backend beyond backend x schedule x communication SMs, and what a user
of a framework or of the library sets to get the winning configuration. A backend declares one as its
class attribute `tuning`; one without it is searched over schedules and SMs alone, and only when named
with --backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moelab.core.workload import Workload


def even_sms(n: float) -> int:
    """The nearest even SM count, at least 2 (DeepEP V1 runs one channel per two SMs and asserts on odd
    counts; the others take any count)."""
    return max(2, int(round(n / 2)) * 2)


class TuneSpace:
    """Subclass per library; the defaults vary nothing and name no setting."""

    dtype: str | None = None  # the dispatch payload tune times by default (None: the workload's)

    def knob_variants(self, sms: int | None) -> list[dict[str, Any]]:
        """The library's chunk/queue settings worth trying at a survivor's SM count (None: the library's
        default), beyond its defaults."""
        return []

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Workload) -> list[str]:
        """Lines a user of Megatron-Core, torchtitan or the library itself sets for this configuration."""
        return []
