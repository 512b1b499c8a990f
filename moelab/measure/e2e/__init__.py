"""End-to-end MoE-layer benchmark: route → dispatch → per-expert SwiGLU FFN → combine, serial or with
communication overlapping expert compute, forward and optionally forward+backward, over any backend.
The case kind's runner is moelab.measure.e2e.bench.run_e2e_case; its settings are moelab.core.e2e_spec's."""
