"""Ordered migrations, each applied once and recorded in `schema_version`; applying twice is a no-op.

Views are not statements of a migration: each is declared once in VIEWS and (re)created at the end of every
migration from the one that introduced it on. DuckDB binds a view's columns when it is created and, before
2.0, keeps that binding after a later ALTER TABLE of a table it reads (`SELECT r.* ...` over `results`
then fails with "Contents of view were altered: types don't match!"); a view created after each migration
always reads the tables as that migration left them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class View:
    name: str
    since: int  # the migration from which on it exists
    select: str

    def create(self) -> str:
        return f"CREATE OR REPLACE VIEW {self.name} AS {self.select}"


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

MIGRATIONS = MIGRATIONS + (
    Migration(
        2,
        "labels, traces, trace kernels, kernel-only times, health, IB counters, nccl-tests, case metrics",
        (
            "CREATE TABLE labels (label VARCHAR PRIMARY KEY, run_id VARCHAR NOT NULL, created_at TIMESTAMP DEFAULT now())",
            """CREATE TABLE traces (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, rank INTEGER, kind VARCHAR, path VARCHAR,
                size_bytes BIGINT)""",
            """CREATE TABLE trace_kernels (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, rank INTEGER, kernel_name VARCHAR,
                count INTEGER, total_us DOUBLE, share DOUBLE)""",
            "ALTER TABLE results ADD COLUMN kernel_us DOUBLE",
            "ALTER TABLE results ADD COLUMN kernel_source VARCHAR",
            "ALTER TABLE cases ADD COLUMN suspect BOOLEAN DEFAULT false",
            "ALTER TABLE cases ADD COLUMN suspect_reason VARCHAR",
            """CREATE TABLE health (
                run_id VARCHAR, backend VARCHAR, phase VARCHAR, host VARCHAR, node INTEGER, worst VARCHAR,
                findings JSON, snapshot JSON)""",
            """CREATE TABLE ib_counters (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, node INTEGER, host VARCHAR, device VARCHAR,
                port INTEGER, status VARCHAR, xmit_bytes DOUBLE, rcv_bytes DOUBLE, xmit_gbps DOUBLE, rcv_gbps DOUBLE,
                rate_gbps DOUBLE, elapsed_s DOUBLE)""",
            """CREATE TABLE nccl_tests (
                run_id VARCHAR, size_bytes BIGINT, count BIGINT, dtype VARCHAR, time_us_oop DOUBLE,
                algbw_gbps_oop DOUBLE, busbw_gbps_oop DOUBLE, wrong_oop BIGINT, time_us_ip DOUBLE,
                algbw_gbps_ip DOUBLE, busbw_gbps_ip DOUBLE, wrong_ip BIGINT, avg_busbw_gbps DOUBLE, status VARCHAR,
                source VARCHAR, argv JSON)""",
            """CREATE TABLE case_metrics (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, name VARCHAR, value DOUBLE, unit VARCHAR,
                definition VARCHAR)""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        3,
        "per-op noise, host sync and stability; op definitions",
        (
            "ALTER TABLE results ADD COLUMN noise DOUBLE",
            "ALTER TABLE results ADD COLUMN host_sync VARCHAR",
            "ALTER TABLE results ADD COLUMN stability VARCHAR",
        ),
    ),
    Migration(
        4,
        "library figures: each library's own benchmark figure beside moelab's (moelab verify)",
        (
            """CREATE TABLE library_figures (
                run_id VARCHAR, backend VARCHAR, library_test VARCHAR, op VARCHAR, dtype VARCHAR, figure VARCHAR,
                case_id VARCHAR, library_label VARCHAR, library_gbps DOUBLE, moelab_gbps DOUBLE, ratio DOUBLE,
                tolerance DOUBLE, verdict VARCHAR, source_log VARCHAR, note VARCHAR)""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        5,
        "measured link peaks of each GPU run (moelab.measure.peaks)",
        (
            """CREATE TABLE measured_peaks (
                run_id VARCHAR, name VARCHAR, gbps DOUBLE, bytes BIGINT, definition VARCHAR)""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        6,
        "failure diagnosis: per rank of a failed job, its exception, stack when stopped, last log lines",
        (
            """CREATE TABLE failure_diagnosis (
                run_id VARCHAR, backend VARCHAR, rank INTEGER, exc_type VARCHAR, exc_message VARCHAR,
                traceback VARCHAR, stack_trigger VARCHAR, stack_where VARCHAR, stack VARCHAR, log_tail VARCHAR,
                root_cause BOOLEAN, headline VARCHAR)""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        7,
        "one-time costs of each job (communicator, buffers, library JIT), kept apart from the measurements",
        ("ALTER TABLE jobs ADD COLUMN one_time_s JSON",),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        8,
        "judgments after ingest in a table of their own (spread, drift), and views that join them in",
        (
            """CREATE TABLE judgments (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, verdict VARCHAR, rule VARCHAR,
                reason VARCHAR, other_run VARCHAR, judged_by VARCHAR, seq INTEGER,
                judged_at TIMESTAMP DEFAULT now())""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        9,
        "measured GPU rates of each GPU run (dense bf16 matmul, HBM copy): the e2e layer's roofline",
        (
            """CREATE TABLE measured_rates (
                run_id VARCHAR, name VARCHAR, value DOUBLE, unit VARCHAR, work DOUBLE, definition VARCHAR)""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        10,
        "repeats: each start of a backend job a process sample (its samples, per-op summaries, outcome), and "
        "per op the bootstrap interval of the median of the per-process medians and their CV",
        (
            "ALTER TABLE samples ADD COLUMN repeat INTEGER DEFAULT 0",
            "ALTER TABLE health ADD COLUMN repeat INTEGER DEFAULT 0",
            "ALTER TABLE results ADD COLUMN repeats INTEGER DEFAULT 1",
            "ALTER TABLE results ADD COLUMN ci_low_us DOUBLE",
            "ALTER TABLE results ADD COLUMN ci_high_us DOUBLE",
            "ALTER TABLE results ADD COLUMN process_cv DOUBLE",
            """CREATE TABLE processes (
                run_id VARCHAR, backend VARCHAR, repeat INTEGER, position INTEGER, status VARCHAR,
                description VARCHAR, returncode INTEGER, duration_s DOUBLE, suspect_reason VARCHAR)""",
            """CREATE TABLE process_results (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, repeat INTEGER, n INTEGER,
                median_us DOUBLE, fastest_median_us DOUBLE, noise DOUBLE, rel_iqr DOUBLE, stability VARCHAR)""",
            """CREATE TABLE process_metrics (
                run_id VARCHAR, backend VARCHAR, case_id VARCHAR, repeat INTEGER, name VARCHAR, value DOUBLE)""",
        ),
    ),
)

MIGRATIONS = MIGRATIONS + (
    Migration(
        11,
        "the judged views rebound to the tables' current columns (a database migrated to 10 on DuckDB 1.x "
        "kept views bound to the results table before migration 10)",
        (),  # the views are recreated after every migration (VIEWS)
    ),
)

# The judged views: each case's suspect mark and each op's stability with the judgments joined in.
VIEWS: tuple[View, ...] = (
    View(
        "cases_judged",
        8,
        """SELECT c.* REPLACE (
            c.suspect OR j.reasons IS NOT NULL AS suspect,
            CASE WHEN j.reasons IS NULL THEN c.suspect_reason
                 WHEN c.suspect_reason IS NULL OR c.suspect_reason = '' THEN j.reasons
                 ELSE c.suspect_reason || '; ' || j.reasons END AS suspect_reason)
        FROM cases c LEFT JOIN (
            SELECT run_id, backend, case_id, string_agg(reason, '; ' ORDER BY judged_at, seq) AS reasons
            FROM judgments WHERE verdict = 'suspect' AND op IS NULL GROUP BY ALL
        ) j USING (run_id, backend, case_id)""",
    ),
    View(
        "results_judged",
        8,
        """SELECT r.* REPLACE (
            CASE WHEN j.reasons IS NULL THEN r.stability
                 WHEN r.stability IS NULL OR r.stability = '' THEN j.reasons
                 ELSE r.stability || '; ' || j.reasons END AS stability)
        FROM results r LEFT JOIN (
            SELECT run_id, backend, case_id, op, string_agg(reason, '; ' ORDER BY judged_at, seq) AS reasons
            FROM judgments WHERE verdict = 'unstable' GROUP BY ALL
        ) j USING (run_id, backend, case_id, op)""",
    ),
)


def views_at(version: int) -> tuple[View, ...]:
    """The views a database at this schema version has."""
    return tuple(v for v in VIEWS if v.since <= version)


RUN_TABLES = (
    "runs", "environment", "jobs", "cases", "results", "bandwidths", "samples",
    "traces", "trace_kernels", "health", "ib_counters", "nccl_tests", "case_metrics", "library_figures", "measured_peaks",
    "failure_diagnosis", "measured_rates", "processes", "process_results", "process_metrics",
)  # fmt: skip
# an export carries the judgments and the labels too; ingest leaves them to moelab.store.judgments (judging
# replaces them) and moelab.store.labels
EXPORT_TABLES = (*RUN_TABLES, "judgments", "labels")
LATEST_VERSION = MIGRATIONS[-1].version
