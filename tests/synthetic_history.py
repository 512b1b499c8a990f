"""A synthetic history of many runs written straight into the store with bulk SQL (no run directories,
no ingest): thousands of runs in seconds, for the history report, compare and the scale benchmark.

Every run measures the same cases: backends x SM settings x ops, one workload. Medians follow a fixed
level per (backend, op) with seeded lognormal noise between runs, plus known steps: `steps` maps a
(backend, op) to (run index, factor) pairs, every later run's times multiplied by the factor. The driver
changes at the middle run and NCCL at three quarters, so the report has environment changes to mark;
every `label_every`-th run gets a label. Samples: `samples_per_run` rows per run spread over its
(case, op) results and 2 ranks, each a time around that result's median.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import duckdb
import numpy as np

from moelab.store.db import migrate

BASE_US = {"dispatch": 300.0, "combine": 280.0, "pair": 620.0}
SPEED = {"nccl-a2a": 1.0, "deepep": 0.5}
BYTES = (
    8192 * 2 * 4096 * 8
)  # rows x bytes per row of the workload below (hidden 8192 bf16, 4096 tokens, topk 8)


@dataclass(kw_only=True)
class HistoryModel:
    runs: int
    samples_per_run: int = 1_000
    backends: Sequence[str] = ("nccl-a2a", "deepep")
    sms: Sequence[int | None] = (None, 24)
    ops: Sequence[str] = ("dispatch", "combine", "pair")
    noise: float = 0.01  # lognormal sigma of a run's median
    steps: Mapping[tuple[str, str], Sequence[tuple[int, float]]] = field(default_factory=dict)
    label_every: int = 0
    start: datetime = datetime(2026, 1, 1)
    every: timedelta = timedelta(hours=1)
    seed: int = 0


def run_id(i: int) -> str:
    return f"r{i:06d}"


def build(con: duckdb.DuckDBPyConnection, m: HistoryModel) -> None:
    """Write the history into `con` (migrated here), replacing nothing: use a fresh database."""
    migrate(con)
    rng = np.random.default_rng(m.seed)
    n = m.runs
    combos = [(b, s, op) for b in m.backends for s in m.sms for op in m.ops]
    factor = np.ones((len(combos), n))
    for k, (b, _s, op) in enumerate(combos):
        for start, f in m.steps.get((b, op), ()):
            factor[k, start:] *= f
    medians = np.array([BASE_US[op] * SPEED.get(b, 1.0) for b, _s, op in combos])[:, None] * factor
    medians *= rng.lognormal(0.0, m.noise, medians.shape)
    idx = np.arange(n)
    created = np.array([m.start + i * m.every for i in range(n)], dtype="datetime64[us]")
    ids = np.array([run_id(i) for i in range(n)], dtype=object)
    _runs = {  # noqa: F841 (read by the SQL below through DuckDB's replacement scan)
        "run_id": ids,
        "created_at": created,
        "label": np.array(["nightly"] * n, dtype=object),
        "driver": np.where(idx < n // 2, "580.65.06", "590.10.01").astype(object),
        "nccl": np.where(idx < 3 * n // 4, "2.28.9", "2.29.1").astype(object),
    }
    con.execute(
        """INSERT INTO runs (run_id, created_at, ingested_at, label, suite, status, backends, command, device, world,
                             nodes, gpus_per_node, moelab_version, git_sha, run_dir, spec)
           SELECT run_id, created_at, created_at, label, 'synthetic', 'complete', ?::VARCHAR[], 'moelab run', 'cuda',
                  2, 1, 2, '0.1.0', 'abc1234', '/nowhere/' || run_id, '{}' FROM _runs""",
        [list(m.backends)],
    )
    con.execute(
        """INSERT INTO environment (run_id, backend, rank, node, host, gpu_name, gpu_count, sm_count, driver, cuda,
                                    nccl, torch, python, moelab_version, git_sha, library_versions, env_vars, raw)
           SELECT run_id, b.backend, rk.rank, 0, 'gpu-node-1', 'NVIDIA H200', 2, 132, driver, '13.0', nccl,
                  '2.11.0', '3.12', '0.1.0', 'abc1234', '{}', '{}', '{}'
           FROM _runs, (SELECT UNNEST(?::VARCHAR[]) AS backend) b, (SELECT UNNEST([0, 1]) AS rank) rk""",
        [list(m.backends)],
    )
    case_rows = sorted({(b, s) for b, s, _op in combos}, key=str)
    _cases = {  # noqa: F841
        "backend": np.array([b for b, _ in case_rows], dtype=object),
        "case_id": np.array([f"{b}-sm{s or 'default'}" for b, s in case_rows], dtype=object),
        "sms": np.array([s if s is not None else -1 for _, s in case_rows], dtype=np.int32),
    }
    con.execute(
        """INSERT INTO cases (run_id, backend, case_id, status, hidden, tokens_per_rank, topk, experts_per_rank, world,
                              gpus_per_node, routing, routing_seed, routing_params, dtype, sms, knobs, backend_record)
           SELECT r.run_id, c.backend, c.case_id, 'ok', 8192, 4096, 8, 2, 2, 2, 'uniform', 0, '{}', 'bf16',
                  CASE WHEN c.sms < 0 THEN NULL ELSE c.sms END, '{}', '{}'
           FROM _runs r, _cases c"""
    )
    k = len(combos)
    med = medians.T.reshape(-1)  # run-major: run i, combo k
    _results = {  # noqa: F841
        "run_id": np.repeat(ids, k),
        "backend": np.array([b for b, _s, _op in combos] * n, dtype=object),
        "case_id": np.array([f"{b}-sm{s or 'default'}" for b, s, _op in combos] * n, dtype=object),
        "op": np.array([op for _b, _s, op in combos] * n, dtype=object),
        "median_us": med,
    }
    con.execute(
        """INSERT INTO results (run_id, backend, case_id, op, n, median_us, p10_us, p90_us, p99_us, min_us, max_us,
                                mean_us, rank_spread_us, rel_iqr, bytes_per_row)
           SELECT run_id, backend, case_id, op, 40, median_us, 0.97 * median_us, 1.04 * median_us,
                  1.1 * median_us, 0.95 * median_us, 1.2 * median_us, median_us, 1.0, 0.03, 16384 FROM _results"""
    )
    con.execute(
        """INSERT INTO bandwidths SELECT run_id, backend, case_id, op, 'nvl_recv', ?, ?, ? / median_us / 1e3
           FROM results""",
        [BYTES, BYTES, BYTES],
    )
    if m.label_every:
        con.execute(
            "INSERT INTO labels (label, run_id) SELECT 'release-' || (i // ?), ? || lpad(CAST(i AS VARCHAR), 6, '0') "
            "FROM range(?, ?, ?) t(i)",
            [m.label_every, "r", m.label_every, n, m.label_every],
        )
    if m.samples_per_run:
        per = max(1, m.samples_per_run // k)  # samples per (run, result): 2 ranks x per/2 iterations
        con.execute(
            """INSERT INTO samples (run_id, backend, case_id, op, rank, iter, time_us)
               SELECT run_id, backend, case_id, op, CAST(i % 2 AS INTEGER), CAST(i // 2 AS INTEGER),
                      median_us * (0.97 + 0.07 * ((hash(run_id, case_id, op, i) % 10007) / 10007.0))
               FROM results, range(?) t(i)""",
            [per],
        )
