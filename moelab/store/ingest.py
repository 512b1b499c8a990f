"""Read a run directory into the database in one transaction (all of it, or nothing).

Summaries (median, percentiles, bandwidths) are computed here from the raw samples, so every number in
the database is derived by one code path from samples the database also keeps.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from moelab.accounting import RankRows, bandwidths
from moelab.rundir import RunDir
from moelab.stats import summarize

OPS = ("dispatch", "combine", "pair")


def _job_status(job: dict[str, Any] | None) -> str:
    if job is None:
        return "not-run"
    if job.get("timed_out"):
        return "timeout"
    if job.get("returncode") == 0:
        return "ok"
    # torchrun stops the surviving ranks with SIGTERM/SIGKILL: only other signals are the backend crashing
    own_signals = [f.get("signal") for f in job.get("failed_ranks", []) if f.get("signal") not in (None, "SIGTERM", "SIGKILL")]
    return "crashed" if own_signals else "failed"


def _failure_reason(job: dict[str, Any] | None) -> str:
    if job is None:
        return "backend job did not run"
    if job.get("description"):
        return str(job["description"])
    return f"backend job failed (exit code {job.get('returncode')})"


def collect(run_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Rows for every table, from the run directory alone."""
    rd = RunDir(run_dir)
    spec = rd.spec
    info = rd.info()
    env0: dict[str, Any] = {}
    tables: dict[str, list[tuple[Any, ...]]] = {k: [] for k in ("environment", "jobs", "cases", "results", "bandwidths")}
    samples: dict[str, list[Any]] = {k: [] for k in ("backend", "case_id", "op", "rank", "iter", "time_us")}
    for backend in spec.backends:
        files = rd.job(backend)
        job = files.read_job()
        status = _job_status(job)
        tables["jobs"].append((
            spec.run_id, backend, status, (job or {}).get("description") or _failure_reason(job) if status != "ok" else "ok",
            (job or {}).get("returncode"), (job or {}).get("signal"), bool((job or {}).get("timed_out")),
            (job or {}).get("duration_s"), json.dumps((job or {}).get("failed_ranks", [])),
            json.dumps({str(k): v for k, v in (job or {}).get("stderr_tails", {}).items()}), json.dumps((job or {}).get("argv", [])),
        ))  # fmt: skip
        for env in files.read_env():
            env0 = env0 or env
            tables["environment"].append((
                spec.run_id, backend, env.get("rank"), env.get("node"), env.get("host"), env.get("gpu_name"),
                env.get("gpu_count"), env.get("sm_count"), env.get("driver"), env.get("cuda"), env.get("nccl"),
                env.get("torch"), env.get("python"), env.get("moelab_version"), env.get("moelab_git_sha"),
                json.dumps(env.get("library_versions", {})), json.dumps(env.get("env_vars", {})), json.dumps(env),
            ))  # fmt: skip
        records = {r["case_id"]: r for r in files.read_results()}
        for case in spec.cases_for(backend):
            rec = records.get(case.case_id)
            if rec is None:
                rec = {"status": "skipped" if case.skip_reason else "failed", "reason": case.skip_reason or _failure_reason(job)}
                if status == "unavailable":
                    rec["status"] = "unavailable"
            wl = case.workload
            check = rec.get("check", {})
            tables["cases"].append((
                spec.run_id, backend, case.case_id, rec["status"], rec.get("reason"), wl.hidden, wl.tokens_per_rank,
                wl.topk, wl.experts_per_rank, spec.launch.world, spec.launch.gpus_per_node, wl.routing.kind,
                wl.routing.seed, json.dumps(wl.to_dict()["routing"]), wl.dtype, case.sms, json.dumps(case.knobs),
                json.dumps(rec.get("backend_record", {})), _finite(check.get("dispatch_err")),
                _finite(check.get("combine_err")), rec.get("host_sync"),
            ))  # fmt: skip
            if rec["status"] != "ok":
                continue
            rows = [RankRows(**r) for r in rec["rows"]]
            for op in OPS:
                opdata = rec["ops"][op]
                s = summarize(opdata["samples_us"])
                tables["results"].append((
                    spec.run_id, backend, case.case_id, op, s.n, s.median_us, s.p10_us, s.p90_us, s.p99_us,
                    s.min_us, s.max_us, s.mean_us, s.rank_spread_us, s.rel_iqr, opdata["bytes_per_row"],
                ))  # fmt: skip
                for bw in bandwidths(rows, opdata["bytes_per_row"], s.median_us):
                    tables["bandwidths"].append((spec.run_id, backend, case.case_id, op, bw.definition, bw.bytes_mean, bw.bytes_max, bw.gbps))
                for rank, per_rank in enumerate(opdata["samples_us"]):
                    for i, t in enumerate(per_rank):
                        samples["backend"].append(backend)
                        samples["case_id"].append(case.case_id)
                        samples["op"].append(op)
                        samples["rank"].append(rank)
                        samples["iter"].append(i)
                        samples["time_us"].append(float(t))
    created = datetime.fromisoformat(spec.created_at).astimezone(timezone.utc).replace(tzinfo=None)
    tables["runs"] = [(
        spec.run_id, created, datetime.now(timezone.utc).replace(tzinfo=None), spec.label, spec.suite, info.get("status", "unknown"),
        list(spec.backends), " ".join(spec.command), spec.launch.device, spec.launch.world, spec.launch.nodes,
        spec.launch.gpus_per_node, env0.get("moelab_version"), env0.get("moelab_git_sha"), str(run_dir.resolve()),
        json.dumps(spec.to_dict()),
    )]  # fmt: skip
    return tables | {"_samples": [samples]}  # type: ignore[dict-item]


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def ingest(con: duckdb.DuckDBPyConnection, run_dir: Path) -> str:
    """Replace the run's rows with what its directory holds, atomically. Returns the run id."""
    tables = collect(run_dir)
    samples = tables.pop("_samples")[0]  # type: ignore[index]
    run_id = tables["runs"][0][0]
    con.execute("BEGIN TRANSACTION")
    try:
        for table in ("runs", "environment", "jobs", "cases", "results", "bandwidths", "samples"):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        for table, rows in tables.items():
            if rows:
                marks = ", ".join(["?"] * len(rows[0]))
                con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        if samples["time_us"]:
            con.execute(
                "INSERT INTO samples SELECT ?, UNNEST(?::VARCHAR[]), UNNEST(?::VARCHAR[]), UNNEST(?::VARCHAR[]), "
                "UNNEST(?::INTEGER[]), UNNEST(?::INTEGER[]), UNNEST(?::DOUBLE[])",
                [run_id, samples["backend"], samples["case_id"], samples["op"], samples["rank"], samples["iter"], samples["time_us"]],
            )
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return str(run_id)
