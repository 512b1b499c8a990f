"""The gate's above-bound flag: a candidate run whose figure beats its bound or peak is not silently
passed, whatever its verdict against the baseline (a bound the run beats was wrong for it, and so may be
the comparison)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from moelab.model.above import above_findings


def above_bound_flags(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per figure of the candidate's annotated result rows (moelab.reports.run_view) above 100%
    of its bound or peak, naming the case, the op and the likely cause."""
    return [
        f"flag: {r['backend']} {r['case_id']} {r['op']}: {f.text()}"
        for r in results
        for f in above_findings(r)
    ]
