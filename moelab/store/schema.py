"""Ordered migrations, each applied once and recorded in `schema_version`; applying twice is a no-op."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "runs, environment, jobs, cases, results, bandwidths, samples",
        (
            """CREATE TABLE runs (
                run_id VARCHAR PRIMARY KEY, created_at TIMESTAMP, ingested_at TIMESTAMP, label VARCHAR,
                suite VARCHAR, status VARCHAR, backends VARCHAR[], command VARCHAR, device VARCHAR,
                world INTEGER, nodes INTEGER, gpus_per_node INTEGER, moelab_version VARCHAR, git_sha VARCHAR,
                run_dir VARCHAR, spec JSON)""",
            """CREATE TABLE environment (
                run_id VARCHAR, backend VARCHAR, rank INTEGER, node INTEGER, host VARCHAR, gpu_name VARCHAR,
                gpu_count INTEGER, sm_count INTEGER, driver VARCHAR, cuda VARCHAR, nccl VARCHAR, torch VARCHAR,
                python VARCHAR, moelab_version VARCHAR, git_sha VARCHAR, library_versions JSON, env_vars JSON, raw JSON)""",
            """CREATE TABLE jobs (
                run_id VARCHAR, backend VARCHAR, status VARCHAR, description VARCHAR, returncode INTEGER,
                signal VARCHAR, timed_out BOOLEAN, duration_s DOUBLE, failed_ranks JSON, stderr_tails JSON, argv JSON,
                PRIMARY KEY (run_id, backend))""",
            """CREATE TABLE cases (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, status VARCHAR, reason VARCHAR,
                hidden INTEGER, tokens_per_rank INTEGER, topk INTEGER, experts_per_rank INTEGER, world INTEGER,
                gpus_per_node INTEGER, routing VARCHAR, routing_seed INTEGER, routing_params JSON, dtype VARCHAR,
                sms INTEGER, knobs JSON, backend_record JSON, dispatch_err DOUBLE, combine_err DOUBLE, host_sync VARCHAR,
                PRIMARY KEY (run_id, backend, case_id))""",
            """CREATE TABLE results (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, n INTEGER, median_us DOUBLE,
                p10_us DOUBLE, p90_us DOUBLE, p99_us DOUBLE, min_us DOUBLE, max_us DOUBLE, mean_us DOUBLE,
                rank_spread_us DOUBLE, rel_iqr DOUBLE, bytes_per_row INTEGER,
                PRIMARY KEY (run_id, backend, case_id, op))""",
            """CREATE TABLE bandwidths (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, definition VARCHAR,
                bytes_mean DOUBLE, bytes_max DOUBLE, gbps DOUBLE,
                PRIMARY KEY (run_id, backend, case_id, op, definition))""",
            """CREATE TABLE samples (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, rank INTEGER, iter INTEGER, time_us DOUBLE)""",
            """CREATE TABLE definitions (name VARCHAR PRIMARY KEY, text VARCHAR)""",
        ),
    ),
)

RUN_TABLES = ("runs", "environment", "jobs", "cases", "results", "bandwidths", "samples")
LATEST_VERSION = MIGRATIONS[-1].version
