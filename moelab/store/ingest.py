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

from moelab.accounting.bandwidth import RankRows, bandwidths, library_figure
from moelab.launch.rundir import RunDir
from moelab.measure.stats import summarize
from moelab.store.samples_bulk import SampleColumns, insert_samples
from moelab.store.schema import RUN_TABLES

# Column lists of the version-1 tables: later migrations add columns, so inserts name theirs.
COLUMNS = {
    "cases": (
        "run_id", "backend", "case_id", "status", "reason", "hidden", "tokens_per_rank", "topk", "experts_per_rank",
        "world", "gpus_per_node", "routing", "routing_seed", "routing_params", "dtype", "sms", "knobs",
        "backend_record", "dispatch_err", "combine_err", "host_sync", "suspect", "suspect_reason",
    ),
    "results": (
        "run_id", "backend", "case_id", "op", "n", "median_us", "p10_us", "p90_us", "p99_us", "min_us", "max_us",
        "mean_us", "rank_spread_us", "rel_iqr", "bytes_per_row", "kernel_us", "kernel_source",
    ),
}  # fmt: skip


def _job_status(job: dict[str, Any] | None) -> str:
    if job is None:
        return "not-run"
    if job.get("timed_out"):
        return "timeout"
    if job.get("returncode") == 0:
        return "ok"
    # torchrun stops the surviving ranks with SIGTERM/SIGKILL: only other signals are the backend crashing
    own_signals = [
        f.get("signal")
        for f in job.get("failed_ranks", [])
        if f.get("signal") not in (None, "SIGTERM", "SIGKILL")
    ]
    return "crashed" if own_signals else "failed"


def _failure_reason(job: dict[str, Any] | None) -> str:
    if job is None:
        return "backend job did not run"
    if job.get("description"):
        return str(job["description"])
    return f"backend job failed (exit code {job.get('returncode')})"


def collect(run_dir: Path) -> dict[str, list[Any]]:
    """Rows for every table (tuples), from the run directory alone; `_samples` holds the samples columns."""
    rd = RunDir(run_dir)
    spec = rd.spec
    info = rd.info()
    env0: dict[str, Any] = {}
    tables: dict[str, list[tuple[Any, ...]]] = {
        k: []
        for k in (
            "environment",
            "jobs",
            "cases",
            "results",
            "bandwidths",
            "traces",
            "trace_kernels",
            "health",
            "ib_counters",
            "nccl_tests",
            "case_metrics",
        )
    }
    samples = SampleColumns()
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
        suspect = _suspect(files.dir / "health_diff.json")
        for case in spec.cases_for(backend):
            rec = records.get(case.case_id)
            if rec is None:
                rec = {
                    "status": "skipped" if case.skip_reason else "failed",
                    "reason": case.skip_reason or _failure_reason(job),
                }
                if status == "unavailable":
                    rec["status"] = "unavailable"
            wl = case.workload
            check = rec.get("check", {})
            is_suspect = suspect is not None and rec["status"] == "ok" and "nccl_tests" not in rec
            tables["cases"].append((
                spec.run_id, backend, case.case_id, rec["status"], rec.get("reason"), wl.hidden, wl.tokens_per_rank,
                wl.topk, wl.experts_per_rank, spec.launch.world, spec.launch.gpus_per_node, wl.routing.kind,
                wl.routing.seed, json.dumps(wl.to_dict()["routing"]), wl.dtype, case.sms, json.dumps(case.knobs),
                json.dumps(rec.get("backend_record", {})), _finite(check.get("dispatch_err")),
                _finite(check.get("combine_err")), rec.get("host_sync"), is_suspect, suspect if is_suspect else None,
            ))  # fmt: skip
            if rec["status"] != "ok":
                continue
            if "nccl_tests" in rec:
                _nccl_tests_rows(tables, spec.run_id, case.case_id, rec["nccl_tests"])
                continue
            rows = [RankRows(**r) for r in rec.get("rows", [])]
            for op, opdata in rec["ops"].items():
                s = summarize(opdata["samples_us"])
                kernel_us = _slowest_kernel_us(opdata.get("kernel"))
                tables["results"].append((
                    spec.run_id, backend, case.case_id, op, s.n, s.median_us, s.p10_us, s.p90_us, s.p99_us,
                    s.min_us, s.max_us, s.mean_us, s.rank_spread_us, s.rel_iqr, opdata.get("bytes_per_row", 0),
                    kernel_us, "torch" if kernel_us is not None else None,
                ))  # fmt: skip
                if rows and opdata.get("bytes_per_row"):
                    for bw in bandwidths(rows, opdata["bytes_per_row"], s.median_us):
                        tables["bandwidths"].append(
                            (
                                spec.run_id,
                                backend,
                                case.case_id,
                                op,
                                bw.definition,
                                bw.bytes_mean,
                                bw.bytes_max,
                                bw.gbps,
                            )
                        )
                    lib = (
                        library_figure(backend, rows, opdata["bytes_per_row"], opdata["samples_us"])
                        if op != "pair"
                        else None
                    )
                    if lib is not None:
                        tables["bandwidths"].append(
                            (
                                spec.run_id,
                                backend,
                                case.case_id,
                                op,
                                lib.definition,
                                lib.bytes_mean,
                                lib.bytes_max,
                                lib.gbps,
                            )
                        )
                    if kernel_us:
                        for bw in bandwidths(rows, opdata["bytes_per_row"], kernel_us):
                            if bw.definition in ("nvl_recv", "nvl_remote"):
                                tables["bandwidths"].append(
                                    (
                                        spec.run_id,
                                        backend,
                                        case.case_id,
                                        op,
                                        bw.definition + "_kernel",
                                        bw.bytes_mean,
                                        bw.bytes_max,
                                        bw.gbps,
                                    )
                                )
                for rank, k in enumerate(opdata.get("kernel") or []):
                    for kern in (k or {}).get("kernels", []):
                        tables["trace_kernels"].append(
                            (
                                spec.run_id,
                                backend,
                                case.case_id,
                                op,
                                rank,
                                kern["name"],
                                kern["count"],
                                kern["total_us"],
                                kern["share"],
                            )
                        )
                samples.add(backend, case.case_id, op, opdata["samples_us"])
            for m in rec.get("metrics", []):
                tables["case_metrics"].append(
                    (
                        spec.run_id,
                        backend,
                        case.case_id,
                        m["name"],
                        _finite(m.get("value")),
                        m.get("unit"),
                        m.get("definition"),
                    )
                )
            for t in rec.get("traces", []) or []:
                tables["traces"].append(
                    (
                        spec.run_id,
                        backend,
                        case.case_id,
                        t.get("rank"),
                        t.get("kind"),
                        t.get("path"),
                        t.get("size_bytes"),
                    )
                )
            for node in rec.get("ib") or []:
                delta = node.get("delta") or {}
                for port in delta.get("ports", []):
                    tables["ib_counters"].append((
                        spec.run_id, backend, case.case_id, node.get("node"), node.get("host"), port.get("device"),
                        port.get("port"), port.get("status"), port.get("xmit_bytes"), port.get("rcv_bytes"),
                        port.get("xmit_gbps"), port.get("rcv_gbps"), port.get("rate_gbps"), delta.get("elapsed_s"),
                    ))  # fmt: skip
        nsys = files.dir / "nsys_traces.json"
        if nsys.exists():
            nsys_data = json.loads(nsys.read_text())
            for t in nsys_data.get("traces", []):
                tables["traces"].append(
                    (
                        spec.run_id,
                        backend,
                        None,
                        t.get("rank"),
                        t.get("kind"),
                        t.get("path"),
                        t.get("size_bytes"),
                    )
                )
            if nsys_data.get("note"):
                job_row = tables["jobs"][-1]
                tables["jobs"][-1] = (*job_row[:3], f"{job_row[3]}; {nsys_data['note']}", *job_row[4:])
        for phase in ("before", "after"):
            snap_path = files.dir / f"health_{phase}.json"
            if snap_path.exists():
                tables["health"].append(_health_row(spec.run_id, backend, phase, snap_path))
    created = datetime.fromisoformat(spec.created_at).astimezone(timezone.utc).replace(tzinfo=None)
    tables["runs"] = [(
        spec.run_id, created, datetime.now(timezone.utc).replace(tzinfo=None), spec.label, spec.suite, info.get("status", "unknown"),
        list(spec.backends), " ".join(spec.command), spec.launch.device, spec.launch.world, spec.launch.nodes,
        spec.launch.gpus_per_node, env0.get("moelab_version"), env0.get("moelab_git_sha"), str(run_dir.resolve()),
        json.dumps(spec.to_dict()),
    )]  # fmt: skip
    return {**tables, "_samples": [samples]}


def _slowest_kernel_us(per_rank: list[dict[str, Any] | None] | None) -> float | None:
    """Kernel-only time of an op: the slowest rank's, as for the event-timed figure."""
    values = [k["kernel_us"] for k in (per_rank or []) if k and k.get("kernel_us") is not None]
    return max(values) if values else None


def _suspect(path: Path) -> str | None:
    """The reason a job's results are suspect (health worsened during it), or None."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if not data.get("suspect"):
        return None
    bad = [f for f in data.get("findings", []) if f.get("status") in ("warn", "fail")]
    return (
        "; ".join(f"{f.get('subject')}: {f.get('reason')}" for f in bad)[:1000]
        or "health worsened during the run"
    )


def _health_row(run_id: str, backend: str, phase: str, path: Path) -> tuple[Any, ...]:
    from moelab.health import rules
    from moelab.health.snapshot import loads

    snap = loads(path.read_text())
    findings = rules.evaluate(snap)
    return (
        run_id,
        backend,
        phase,
        snap.host,
        0,
        rules.worst(findings),
        json.dumps([f.to_dict() for f in findings]),
        path.read_text(),
    )


def _nccl_tests_rows(
    tables: dict[str, list[tuple[Any, ...]]], run_id: str, case_id: str, data: dict[str, Any]
) -> None:
    row, res = data["row"], data["result"]
    tables["nccl_tests"].append((
        run_id, row["size_bytes"], row["count"], row["dtype"], row["time_us_oop"], row["algbw_gbps_oop"],
        row["busbw_gbps_oop"], row["wrong_oop"], row["time_us_ip"], row["algbw_gbps_ip"], row["busbw_gbps_ip"],
        row["wrong_ip"], res.get("avg_busbw_gbps"), res.get("status"), res.get("source"), json.dumps(res.get("argv")),
    ))  # fmt: skip
    t = row["time_us_oop"]
    tables["results"].append(
        (run_id, "nccl-tests", case_id, "alltoall", 1, t, t, t, t, t, t, t, 0.0, 0.0, 0, None, None)
    )
    for name, gbps in (("nccl_algbw", row["algbw_gbps_oop"]), ("nccl_busbw", row["busbw_gbps_oop"])):
        tables["bandwidths"].append(
            (
                run_id,
                "nccl-tests",
                case_id,
                "alltoall",
                name,
                float(row["size_bytes"]),
                float(row["size_bytes"]),
                gbps,
            )
        )


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def ingest(con: duckdb.DuckDBPyConnection, run_dir: Path) -> str:
    """Replace the run's rows with what its directory holds, atomically. Returns the run id."""
    tables = collect(run_dir)
    samples: SampleColumns = tables.pop("_samples")[0]
    run_id = tables["runs"][0][0]
    con.execute("BEGIN TRANSACTION")
    try:
        for table in RUN_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        for table, rows in tables.items():
            if rows:
                marks = ", ".join(["?"] * len(rows[0]))
                columns = ", ".join(COLUMNS[table]) if table in COLUMNS else ""
                target = f"{table} ({columns})" if columns else table
                con.executemany(f"INSERT INTO {target} VALUES ({marks})", rows)
        insert_samples(con, run_id, samples)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return str(run_id)
