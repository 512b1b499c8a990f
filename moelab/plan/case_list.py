"""The case ids a suite expands to for the chosen backends and flags (`moelab run --list-cases`), so that
`--case ID` can be given one of them without running anything."""

from __future__ import annotations

from collections.abc import Sequence

from moelab.core.spec import CaseSpec


def case_rows(cases: Sequence[CaseSpec]) -> list[tuple[str, str, str, str]]:
    """(backend, case id, workload, what happens to it) per case, in suite order."""
    rows = []
    for c in cases:
        wl = c.workload
        workload = (
            f"hidden {wl.hidden}, {wl.tokens_per_rank} tokens/rank, topk {wl.topk}, {wl.experts_per_rank} experts/rank, "
            f"{wl.routing.kind}, {wl.dtype}, SMs {c.sms if c.sms is not None else 'default'}"
        )
        rows.append(
            (c.backend, c.case_id, workload, f"skipped: {c.skip_reason}" if c.skip_reason else "to run")
        )
    return rows
