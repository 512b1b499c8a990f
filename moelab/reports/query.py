"""Reading runs out of the store for reports and comparisons: plain dict rows, one query per table."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from moelab.core.errors import MoelabError
from moelab.store.db import has_column, has_table
from moelab.store.order import case_order, op_order

BANDWIDTH_PIVOT = """
    SELECT run_id, backend, case_id, op,
           max(CASE WHEN definition = 'nvl_recv' THEN gbps END) AS nvl_gbps,
           max(CASE WHEN definition = 'nvl_remote' THEN gbps END) AS remote_gbps,
           max(CASE WHEN definition = 'rdma_pairs' THEN gbps END) AS rdma_gbps,
           max(CASE WHEN definition = 'rdma_remote' THEN gbps END) AS rdma_remote_gbps,
           max(CASE WHEN definition = 'nvl_recv' THEN bytes_mean END) AS nvl_bytes
    FROM bandwidths GROUP BY ALL"""


def select(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    """Rows of one query as dicts keyed by column name (what the templates and sections read)."""
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description or []]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def latest_run_ids(con: duckdb.DuckDBPyConnection, n: int = 1) -> list[str]:
    return [
        r[0]
        for r in con.execute(
            "SELECT run_id FROM runs ORDER BY created_at DESC, run_id DESC LIMIT ?", [n]
        ).fetchall()
    ]


def select_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    """Bind the run ids to a temp table `_sel` (never formatted into SQL); unknown ids are a user error."""
    known = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    missing = [r for r in run_ids if r not in known]
    if missing:
        raise MoelabError(f"no such run(s): {', '.join(missing)}")
    con.execute("CREATE OR REPLACE TEMP TABLE _sel AS SELECT UNNEST(?::VARCHAR[]) AS run_id", [run_ids])


def runs(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    from moelab.store.labels import names_by_run

    rows = select(
        con,
        """SELECT r.run_id, r.created_at, r.label, r.suite, r.status, r.backends, r.device, r.world, r.nodes,
                  r.gpus_per_node, r.command, r.moelab_version, r.git_sha, r.run_dir
           FROM runs r SEMI JOIN _sel USING (run_id) ORDER BY r.created_at, r.run_id""",
    )
    names = names_by_run(con)
    for r in rows:
        r["labels"] = names.get(r["run_id"], [])
    return rows


def environment(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """One row per (run, backend, rank): the fingerprint each rank recorded."""
    rows = select(
        con,
        """SELECT run_id, backend, rank, node, host, gpu_name, gpu_count, sm_count, driver, cuda, nccl, torch, python,
                  moelab_version, git_sha, CAST(library_versions AS VARCHAR) AS library_versions
           FROM environment SEMI JOIN _sel USING (run_id) ORDER BY run_id, node, backend, rank""",
    )
    for r in rows:
        r["library_versions"] = json_obj(r["library_versions"])
    return rows


def results(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Measured (case, op) rows with their workload, times, bandwidths and flags."""
    rows = select(
        con,
        f"""WITH bw AS ({BANDWIDTH_PIVOT})
           SELECT c.run_id, c.backend, c.case_id, c.status, c.hidden, c.tokens_per_rank, c.topk, c.experts_per_rank,
                  c.routing, c.routing_seed, c.dtype, c.sms, c.world, CAST(c.knobs AS VARCHAR) AS knobs,
                  json_extract_string(c.backend_record, '$.dispatch_family') AS dispatch_family,
                  c.gpus_per_node, CAST(c.routing_params AS VARCHAR) AS routing_params,
                  c.dispatch_err, c.combine_err, c.suspect, c.suspect_reason,
                  (SELECT coalesce(x.suspect, false) FROM cases x WHERE x.run_id = c.run_id
                     AND x.backend = c.backend AND x.case_id = c.case_id) AS contended,
                  r.op, r.n, r.median_us, r.p10_us, r.p90_us, r.p99_us, r.rank_spread_us, r.rel_iqr, r.kernel_us,
                  r.bytes_per_row,
                  r.noise, r.host_sync, r.stability, r.repeats, r.ci_low_us, r.ci_high_us, r.process_cv,
                  (SELECT max(p.gbps) FROM measured_peaks p WHERE p.run_id = c.run_id AND p.name IN ('a2a_remote', 'peer_exchange_all'))
                      AS measured_remote_peak_gbps,
                  (SELECT max(p.gbps) FROM measured_peaks p WHERE p.run_id = c.run_id AND (p.name LIKE 'peer_copy_shift%' OR p.name = 'peer_exchange_all'))
                      AS measured_peer_peak_gbps,
                  bw.nvl_gbps, bw.remote_gbps, bw.rdma_gbps, bw.rdma_remote_gbps, bw.nvl_bytes,
                  bw.nvl_bytes / r.p90_us / 1e3 AS nvl_gbps_p90t, bw.nvl_bytes / r.p10_us / 1e3 AS nvl_gbps_p10t
           FROM cases_judged c JOIN results_judged r USING (run_id, backend, case_id)
           LEFT JOIN bw USING (run_id, backend, case_id, op)
           WHERE c.run_id IN (SELECT run_id FROM _sel)
           ORDER BY {case_order("c")}, {op_order("r.op")}, c.run_id""",
    )
    for r in rows:
        r["knobs"] = json_obj(r["knobs"])
    return rows


ProcessKey = tuple[str, str, str, str]  # run, backend, case, op


def process_medians(con: duckdb.DuckDBPyConnection) -> dict[ProcessKey, tuple[list[float], list[float]]]:
    """(run, backend, case, op) -> the median of each start of its job (--repeat; one without) of the
    slowest rank's iteration times, and of the fastest rank's, in start order, read from the samples."""
    repeat = "repeat" if has_column(con, "samples", "repeat") else "0"
    rows = con.execute(
        f"""SELECT run_id, backend, case_id, op, list(slow ORDER BY rep), list(fast ORDER BY rep) FROM (
                SELECT run_id, backend, case_id, op, rep, median(slow) AS slow, median(fast) AS fast FROM (
                    SELECT run_id, backend, case_id, op, {repeat} AS rep, iter, max(time_us) AS slow,
                           min(time_us) AS fast
                    FROM samples WHERE run_id IN (SELECT run_id FROM _sel) GROUP BY ALL)
                GROUP BY ALL)
            GROUP BY ALL"""
    ).fetchall()
    return {(r[0], r[1], r[2], r[3]): (list(r[4]), list(r[5])) for r in rows}


def not_measured(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Cases not measured, with the cause of their job's failure (`cause`) where one was diagnosed."""
    rows = select(
        con,
        "SELECT run_id, backend, case_id, status, reason FROM cases SEMI JOIN _sel USING (run_id) "
        f"WHERE status <> 'ok' ORDER BY run_id, {case_order()}",
    )
    causes = _causes(con)
    for r in rows:
        r["cause"] = causes.get((r["run_id"], r["backend"])) if r["status"] in BAD_STATUSES else None
    return rows


BAD_STATUSES = ("failed", "crashed", "timeout")


def _causes(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], str]:
    if not has_table(con, "failure_diagnosis"):
        return {}
    return {
        (r[0], r[1]): r[2]
        for r in con.execute(
            "SELECT run_id, backend, any_value(headline) FROM failure_diagnosis SEMI JOIN _sel USING (run_id) "
            "WHERE headline IS NOT NULL GROUP BY ALL"
        ).fetchall()
    }


def failure_ranks(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per rank of each failed job: exception, where its stack was, its stack and its last log lines."""
    if not has_table(con, "failure_diagnosis"):
        return []
    return select(
        con,
        "SELECT run_id, backend, rank, exc_type, exc_message, traceback, stack_trigger, stack_where, stack, "
        "log_tail, root_cause FROM failure_diagnosis SEMI JOIN _sel USING (run_id) ORDER BY run_id, backend, rank",
    )


def suspects(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return select(
        con,
        "SELECT run_id, backend, case_id, suspect_reason FROM cases_judged SEMI JOIN _sel USING (run_id) "
        f"WHERE suspect ORDER BY run_id, {case_order()}",
    )


def jobs(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    rows = select(
        con,
        "SELECT run_id, backend, status, description, returncode, signal, timed_out, duration_s FROM jobs "
        "SEMI JOIN _sel USING (run_id) ORDER BY run_id, backend",
    )
    causes = _causes(con)
    for r in rows:
        r["cause"] = causes.get((r["run_id"], r["backend"]))
    return rows


def health(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Health snapshots whose worst finding is not a pass, with those findings."""
    rows = select(
        con,
        "SELECT run_id, backend, phase, host, node, worst, CAST(findings AS VARCHAR) AS findings FROM health "
        "SEMI JOIN _sel USING (run_id) ORDER BY run_id, backend, phase, node",
    )
    out = []
    for r in rows:
        findings = _json_list(r.pop("findings"))
        r["findings"] = [f for f in findings if isinstance(f, dict) and f.get("status") in ("warn", "fail")]
        r["num_findings"] = len(findings)
        out.append(r)
    return out


def health_snapshots(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The stored health snapshots (NVML's reading of the machine: its links among the rest) per job."""
    return select(
        con,
        "SELECT run_id, backend, phase, CAST(snapshot AS VARCHAR) AS snapshot FROM health "
        "SEMI JOIN _sel USING (run_id) WHERE snapshot IS NOT NULL ORDER BY run_id, backend, phase",
    )


def traces(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return select(
        con,
        """SELECT t.run_id, t.backend, t.case_id, t.rank, t.kind, t.path, t.size_bytes, r.run_dir
           FROM traces t JOIN runs r USING (run_id) WHERE t.run_id IN (SELECT run_id FROM _sel)
           ORDER BY t.run_id, t.backend, t.case_id, t.rank""",
    )


def case_metrics(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return select(
        con,
        "SELECT run_id, backend, case_id, name, value, unit, definition FROM case_metrics "
        "SEMI JOIN _sel USING (run_id) ORDER BY run_id, backend, case_id, name",
    )


def definitions(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return select(con, "SELECT name, text FROM definitions ORDER BY name")


def json_obj(text: Any) -> dict[str, Any]:
    """A JSON column of the store (knobs, records, versions) as a dict: {} where it is empty, not an
    object, or not JSON."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _json_list(text: Any) -> list[Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []
