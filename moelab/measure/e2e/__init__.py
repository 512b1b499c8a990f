"""End-to-end MoE-layer benchmark: route → dispatch → per-expert SwiGLU FFN → combine, serial or with
communication overlapping expert compute, forward and optionally forward+backward, over any backend."""

from moelab.measure.e2e.bench import run_e2e_case
from moelab.measure.e2e.settings import (
    BENCH_E2E,
    BENCH_KNOB,
    E2E_KNOBS,
    backend_case_config,
    backend_knobs,
    is_e2e,
)

__all__ = [
    "BENCH_E2E",
    "BENCH_KNOB",
    "E2E_KNOBS",
    "backend_case_config",
    "backend_knobs",
    "is_e2e",
    "run_e2e_case",
]
