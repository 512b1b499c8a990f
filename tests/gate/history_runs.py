"""Earlier runs for gate tests: what the gate learns each op's noise from. Without them it holds an op to
its class's prior, under which a host-sync op (roundtrip) cannot be judged at repeat 1."""

from __future__ import annotations

from tests.synthetic_runs import RunModel


def history(n: int, start_day: int = 1, **model: object) -> list[RunModel]:
    """`n` runs of the same cases, one a day from November `start_day`, seeds 100 on."""
    return [
        RunModel(
            run_id=f"hist{i}", created_at=f"2026-11-{start_day + i:02d}T07:00:00+00:00", seed=100 + i, **model
        )  # type: ignore[arg-type]
        for i in range(n)
    ]
