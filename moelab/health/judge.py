"""What is judged of a run once it is stored: spread against the case's history and the noise target,
and run-to-run drift of each op's median. One entry point, so `moelab run` and `moelab ingest` agree."""

from __future__ import annotations

from typing import Any

from moelab.health.contention import mark_spread_suspects
from moelab.health.drift import mark_drift


def judge_stored_run(con: Any, run_id: str) -> None:
    mark_spread_suspects(con, run_id)
    mark_drift(con, run_id)
