"""Read a run directory into the database in one transaction (all of it, or nothing).

Ingest only stores: every summary, figure, health verdict and suspect mark was made before, in the
worker's CaseRecord (moelab.record) or by the runner next to the job's files. Rows are built as
{column: value} and inserted by column name, so the schema's column order never matters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from moelab.core.case_record import CaseRecord, OpResult
from moelab.core.repeats import merge_starts, process_ops
from moelab.core.spec import CaseSpec, RunSpec
from moelab.health.contention import job_suspect_reason
from moelab.job.diagnosis import diagnosis_rows
from moelab.job.events import one_time_costs
from moelab.job.rundir import HEALTH_PHASES, JobFiles, LineProblem, RunDir
from moelab.store.db import transaction
from moelab.store.samples_bulk import SampleColumns, insert_samples
from moelab.store.schema import RUN_TABLES
from moelab.store.starts import MISSING_STATUSES
from moelab.tracing.nsys import path_outside, trace_problem

Row = dict[str, Any]
DIAGNOSIS_COLUMNS = (
    "run_id",
    "backend",
    "rank",
    "exc_type",
    "exc_message",
    "traceback",
    "stack_trigger",
    "stack_where",
    "stack",
    "log_tail",
    "root_cause",
    "headline",
)


def _job_status(job: dict[str, Any] | None) -> str:
    if job is None:
        return "not-run"
    if job.get("interrupted"):
        return "interrupted"
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


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def storable(v: Any) -> Any:
    """A value DuckDB can store: text that is not valid UTF-8 (lone surrogates from a command line read
    under another locale, `spec.command`, a path) is kept with those characters escaped, never refused."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
    return v


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {storable(str(k)): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return storable(obj)


def _json(obj: Any, **kwargs: Any) -> str:
    """JSON text for a JSON column: DuckDB refuses a lone surrogate escape (`\\udcff`) in JSON, so text
    that is not valid UTF-8 is escaped first, as in `storable`."""
    return json.dumps(_clean(obj), **kwargs)


class RunRows:
    """Rows of every table for one run, gathered from its directory before the transaction opens."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.tables: dict[str, list[Row]] = {}
        self.samples = SampleColumns()
        self.definitions: dict[str, str] = {}
        self.problems: list[str] = []  # what ingest warns of: lines that were not records (stored as
        # failures), ragged samples (stored as suspect), traces that are not what they are registered as

    def add(self, table: str, **row: Any) -> None:
        self.tables.setdefault(table, []).append({"run_id": self.run_id} | row)


def _job_row(files: JobFiles) -> tuple[Row, dict[str, Any] | None]:
    """(the `jobs` columns of one start of a job, its job.json)."""
    job = files.read_job()
    status = _job_status(job)
    j = job or {}
    description = j.get("description") or _failure_reason(job) if status != "ok" else "ok"
    note = files.read_nsys_traces().get("note")
    if note:
        description = f"{description}; {note}"
    row = dict(
        status=status,
        description=description,
        returncode=j.get("returncode"),
        signal=j.get("signal"),
        timed_out=bool(j.get("timed_out")),
        duration_s=j.get("duration_s"),
        failed_ranks=_json(j.get("failed_ranks", [])),
        stderr_tails=_json({str(k): v for k, v in j.get("stderr_tails", {}).items()}),
        argv=_json(j.get("argv", [])),
        one_time_s=_json(one_time_costs(files.dir)),
    )
    return row, job


def _merged_job(starts: list[Row]) -> Row:
    """One `jobs` row over the starts of a job (--repeat): ok when every start was, else the first that
    was not, its description naming each start that failed; durations summed."""
    bad = [(k, r) for k, r in enumerate(starts) if r["status"] != "ok"]
    row = dict(bad[0][1] if bad else starts[0])
    if bad:
        row["description"] = "; ".join(f"start {k + 1}: {r['description']}" for k, r in bad)[:4000]
    durations = [r["duration_s"] for r in starts if r["duration_s"] is not None]
    row["duration_s"] = sum(durations) if durations else None
    row["timed_out"] = any(r["timed_out"] for r in starts)
    return row


def job_rows(rows: RunRows, backend: str, starts: list[JobFiles]) -> list[dict[str, Any] | None]:
    """The job's row (one over all its starts) and its traces; returns each start's job.json."""
    found = [_job_row(files) for files in starts]
    row = found[0][0] if len(found) == 1 else _merged_job([r for r, _ in found])
    rows.add("jobs", backend=backend, **row)
    for files in starts:
        for t in files.read_nsys_traces().get("traces", []):
            problem = trace_problem(files.run_dir, t.get("kind"), t.get("path"))
            if problem is not None:  # a file that is not what it is registered as: said, never stored
                rows.problems.append(f"{backend}: {problem}")
                continue
            rows.add(
                "traces",
                backend=backend,
                case_id=None,
                rank=t.get("rank"),
                kind=t.get("kind"),
                path=t.get("path"),
                size_bytes=t.get("size_bytes"),
            )
    return [job for _, job in found]


def process_rows(
    rows: RunRows, spec: RunSpec, backend: str, starts: list[JobFiles], suspects: list[str | None]
) -> None:
    """With --repeat N, one `processes` row per start: where it ran in the rotated order, how it ended."""
    order = spec.job_order()
    for files, suspect in zip(starts, suspects, strict=True):
        row, _ = _job_row(files)
        rows.add(
            "processes",
            backend=backend,
            repeat=files.repeat,
            position=order.index((backend, files.repeat)),
            status=row["status"],
            description=row["description"],
            returncode=row["returncode"],
            duration_s=row["duration_s"],
            suspect_reason=suspect,
        )


def environment_rows(rows: RunRows, backend: str, files: JobFiles) -> dict[str, Any]:
    first: dict[str, Any] = {}
    for env in files.read_env():
        first = first or env
        rows.add(
            "environment",
            backend=backend,
            rank=env.get("rank"),
            node=env.get("node"),
            host=env.get("host"),
            gpu_name=env.get("gpu_name"),
            gpu_count=env.get("gpu_count"),
            sm_count=env.get("sm_count"),
            driver=env.get("driver"),
            cuda=env.get("cuda"),
            nccl=env.get("nccl"),
            torch=env.get("torch"),
            python=env.get("python"),
            moelab_version=env.get("moelab_version"),
            git_sha=env.get("moelab_git_sha"),
            library_versions=_json(env.get("library_versions", {})),
            env_vars=_json(env.get("env_vars", {})),
            raw=_json(env),
        )
    return first


def health_rows(rows: RunRows, backend: str, files: JobFiles) -> None:
    """Snapshots and the verdicts the runner wrote beside them (moelab.launch.runner judges, not ingest),
    of one start of the job (`repeat`)."""
    for phase in HEALTH_PHASES:
        health = files.read_health(phase)
        if health is None:
            continue
        snapshot, verdict = health
        rows.add(
            "health",
            backend=backend,
            phase=phase,
            host=snapshot.get("host"),
            node=0,
            worst=verdict.get("worst"),
            findings=_json(verdict.get("findings", [])),
            snapshot=_json(snapshot, sort_keys=True),
            repeat=files.repeat,
        )


def suspect_reason(files: JobFiles) -> str | None:
    """The reason the runner found this job's results suspect (health worsened during it), or None."""
    data = files.read_health_diff() or {}
    return data.get("suspect_reason") if data.get("suspect") else None


def case_rows(rows: RunRows, spec: RunSpec, rec: CaseRecord, job_suspect: str | None) -> None:
    case, wl = rec.case, rec.case.workload
    check = rec.check
    measured = rec.status == "ok" and rec.nccl_tests is None
    suspect = rec.suspect_reason or (job_suspect if measured else None)
    ragged = ragged_reason(rec) if measured else None
    if ragged is not None:  # a median over unequal ranks is not the case's median: marked and said
        suspect = f"{ragged}; {suspect}" if suspect else ragged
        rows.problems.append(f"{rec.backend} case {rec.case_id}: {ragged}")
    rows.add(
        "cases",
        backend=rec.backend,
        case_id=rec.case_id,
        status=rec.status,
        reason=rec.reason,
        hidden=wl.hidden,
        tokens_per_rank=wl.tokens_per_rank,
        topk=wl.topk,
        experts_per_rank=wl.experts_per_rank,
        world=spec.launch.world,
        gpus_per_node=spec.launch.gpus_per_node,
        routing=wl.routing.kind,
        routing_seed=wl.routing.seed,
        routing_params=_json(wl.to_dict()["routing"]),
        dtype=wl.dtype,
        sms=case.sms,
        knobs=_json(case.asked_knobs()),
        backend_record=_json(rec.backend_record),
        dispatch_err=_finite(check.dispatch_err) if check else None,
        combine_err=_finite(check.combine_err) if check else None,
        host_sync=rec.host_sync,
        suspect=suspect is not None,
        suspect_reason=suspect,
    )
    if rec.status != "ok":
        return
    if rec.nccl_tests is not None:
        nccl_tests_rows(rows, rec)
        return
    for op in rec.ops:
        op_rows(rows, rec, op)
    attachment_rows(rows, rec)


def ragged_reason(rec: CaseRecord) -> str | None:
    """Why a measured case's samples are ragged (its ranks hold different numbers of samples of one op, as
    a rank that stopped timing early leaves them), or None when every rank holds as many."""
    for op in rec.ops:
        counts = [len(r) for r in op.samples_us]
        if len(set(counts)) > 1:
            short = min(range(len(counts)), key=lambda r: counts[r])
            return (
                f"ragged samples: {op.op} has {min(counts)} to {max(counts)} samples per rank "
                f"(rank {short} holds {counts[short]})"
            )
    return None


def attachment_rows(rows: RunRows, rec: CaseRecord) -> None:
    """What a measured case carries besides its ops: derived metrics, trace files, IB counter deltas."""
    key = {"backend": rec.backend, "case_id": rec.case_id}
    for m in rec.metrics:
        rows.add(
            "case_metrics", **key, name=m.name, value=_finite(m.value), unit=m.unit, definition=m.definition
        )
    for t in rec.traces:
        outside = path_outside(t.path)
        if outside is not None:  # the report links it from the run directory: never to a file elsewhere
            rows.problems.append(f"{rec.backend} case {rec.case_id}: {outside}")
            continue
        rows.add("traces", **key, rank=t.rank, kind=t.kind, path=t.path, size_bytes=t.size_bytes)
    for node in rec.ib or ():
        for p in node.ports:
            rows.add(
                "ib_counters",
                **key,
                node=node.node,
                host=node.host,
                device=p.device,
                port=p.port,
                status=p.status,
                xmit_bytes=p.xmit_bytes,
                rcv_bytes=p.rcv_bytes,
                xmit_gbps=p.xmit_gbps,
                rcv_gbps=p.rcv_gbps,
                rate_gbps=p.rate_gbps,
                elapsed_s=node.elapsed_s,
            )


def op_rows(rows: RunRows, rec: CaseRecord, op: OpResult) -> None:
    s = op.summary
    key = {"backend": rec.backend, "case_id": rec.case_id, "op": op.op}
    rows.add(
        "results",
        **key,
        n=s.n,
        median_us=s.median_us,
        p10_us=s.p10_us,
        p90_us=s.p90_us,
        p99_us=s.p99_us,
        min_us=s.min_us,
        max_us=s.max_us,
        mean_us=s.mean_us,
        rank_spread_us=s.rank_spread_us,
        rel_iqr=_finite(s.rel_iqr),
        bytes_per_row=op.bytes_per_row,
        kernel_us=op.kernel_us,
        kernel_source="torch" if op.kernel_us is not None else None,
        noise=_finite(s.noise),
        host_sync=op.host_sync,
        stability=op.stability,
        repeats=s.repeats,
        ci_low_us=_finite(s.ci_low_us),
        ci_high_us=_finite(s.ci_high_us),
        process_cv=_finite(s.process_cv),
    )
    for f in op.figures:
        rows.add(
            "bandwidths",
            **key,
            definition=f.definition,
            bytes_mean=f.bytes_mean,
            bytes_max=f.bytes_max,
            gbps=_finite(f.gbps),
        )
        if f.text:
            rows.definitions[f.definition] = f.text
    for rank, k in enumerate(op.kernel or ()):
        for kern in k.kernels if k is not None else ():
            rows.add(
                "trace_kernels",
                **key,
                rank=rank,
                kernel_name=kern.name,
                count=kern.count,
                total_us=kern.total_us,
                share=kern.share,
            )


def nccl_tests_rows(rows: RunRows, rec: CaseRecord) -> None:
    r = rec.nccl_tests
    assert r is not None
    rows.add(
        "nccl_tests",
        size_bytes=r.size_bytes,
        count=r.count,
        dtype=r.dtype,
        time_us_oop=r.time_us_oop,
        algbw_gbps_oop=r.algbw_gbps_oop,
        busbw_gbps_oop=r.busbw_gbps_oop,
        wrong_oop=r.wrong_oop,
        time_us_ip=r.time_us_ip,
        algbw_gbps_ip=r.algbw_gbps_ip,
        busbw_gbps_ip=r.busbw_gbps_ip,
        wrong_ip=r.wrong_ip,
        avg_busbw_gbps=r.avg_busbw_gbps,
        status=r.status,
        source=r.source,
        argv=_json(list(r.argv)),
    )
    for op in rec.ops:  # the alltoall line as an op, with nccl-tests' own algbw/busbw as its figures
        op_rows(rows, rec, op)


def _record_for(
    case: CaseSpec,
    got: CaseRecord | None,
    job: dict[str, Any] | None,
    world: int,
    gpn: int,
    problems: dict[str | None, list[LineProblem]],
) -> CaseRecord:
    """The worker's record, or what the case became when no whole record of it is on disk."""
    if got is not None:
        return got
    if case.skip_reason:
        return CaseRecord.skipped(case, case.skip_reason, world=world, gpus_per_node=gpn)
    own = problems.get(case.case_id, [])
    if own:
        return CaseRecord.failed(
            case, "its record is unreadable: " + own[-1].text(), world=world, gpus_per_node=gpn
        )
    if job is not None and _job_status(job) == "ok":
        where = f"{case.backend}/results.jsonl"
        unnamed = problems.get(None, [])
        why = "; ".join(p.text() for p in unnamed[:3]) if unnamed else f"no record of it in {where}"
        return CaseRecord.failed(
            case,
            f"its job ended ok but left no readable record of this case ({why})",
            world=world,
            gpus_per_node=gpn,
        )
    return CaseRecord.failed(case, _failure_reason(job), world=world, gpus_per_node=gpn)


def start_rows(
    rows: RunRows, merged: CaseRecord, starts: list[tuple[int, CaseRecord]], repeated: bool
) -> None:
    """Each start's raw samples (with its start index `k`), and with --repeat (`repeated`) its per-op and
    metric rows."""
    if merged.status != "ok":
        return
    key = {"backend": merged.backend, "case_id": merged.case_id}
    for k, rec in starts:
        for op in rec.ops:
            rows.samples.add(merged.backend, merged.case_id, op.op, op.samples_us, repeat=k)
        if not repeated:
            continue  # one start: the case's own rows say it all, nothing more is stored
        for p in process_ops(k, rec):
            rows.add(
                "process_results",
                **key,
                op=p.op,
                repeat=p.repeat,
                n=p.n,
                median_us=_finite(p.median_us),
                fastest_median_us=_finite(p.fastest_median_us),
                noise=p.noise,
                rel_iqr=p.rel_iqr,
                stability=p.stability,
            )
        for m in rec.metrics:
            rows.add("process_metrics", **key, repeat=k, name=m.name, value=_finite(m.value))


def start_records(
    rows: RunRows, spec: RunSpec, files: JobFiles, job: dict[str, Any] | None
) -> tuple[list[CaseRecord], set[str]]:
    """One start's record of every case of its backend (what each case became where it left none), and the
    cases it measured; its diagnosis and health rows."""
    backend = files.backend
    scan = files.scan_results()
    records = {r.case_id: r for r in scan.records}
    problems: dict[str | None, list[LineProblem]] = {}
    spec_ids = {c.case_id for c in spec.cases_for(backend)}
    for p in scan.problems:  # keyed by the case a bad line names, when that case has no whole record
        key = p.case_id if p.case_id in spec_ids and p.case_id not in records else None
        problems.setdefault(key, []).append(p)
        rows.problems.append(p.text())
    for d in diagnosis_rows(spec.run_id, files.dir):
        rows.tables.setdefault("failure_diagnosis", []).append(dict(zip(DIAGNOSIS_COLUMNS, d, strict=True)))
    health_rows(rows, backend, files)
    world, gpn = spec.launch.world, spec.launch.gpus_per_node
    measured = {r.case_id for r in scan.records if r.status == "ok"}
    return [
        _record_for(case, records.get(case.case_id), job, world, gpn, problems)
        for case in spec.cases_for(backend)
    ], measured


def finished_starts(
    per_start: tuple[CaseRecord, ...], missing: set[int], measured: list[set[str]]
) -> list[tuple[int, CaseRecord]]:
    """The starts a case is merged over: every start that ran to its end, and a start the user's stop cut
    short only where it measured the case before it. A case no such start measured keeps every start's
    record, so its row says why it was not measured."""
    kept = [(k, rec) for k, rec in enumerate(per_start) if k not in missing or rec.case_id in measured[k]]
    return kept or list(enumerate(per_start))


def backend_rows(rows: RunRows, spec: RunSpec, rd: RunDir, backend: str) -> dict[str, Any]:
    """Every table's rows of one backend: its job over all its starts (--repeat), each case merged over
    the starts that finished (moelab.core.repeats; a run stopped in its last start keeps the others, and
    its `processes` rows name the starts that are missing); returns the first rank's environment."""
    starts = rd.starts(backend)
    jobs = job_rows(rows, backend, starts)
    first_env: dict[str, Any] = {}
    for files in starts:
        first_env = first_env or environment_rows(rows, backend, files)
    suspects = [job_suspect_reason(f.read_contention(), suspect_reason(f)) for f in starts]
    if len(starts) > 1:
        process_rows(rows, spec, backend, starts, suspects)
    named = [f"start {k + 1}: {s}" for k, s in enumerate(suspects) if s]
    job_suspect = suspects[0] if len(starts) == 1 else "; ".join(named)[:1000] or None
    found = [start_records(rows, spec, files, job) for files, job in zip(starts, jobs, strict=True)]
    measured = [ids for _, ids in found]
    missing = {k for k, job in enumerate(jobs) if _job_status(job) in MISSING_STATUSES}
    for per_start in zip(*(records for records, _ in found), strict=True):
        kept = finished_starts(per_start, missing, measured)
        merged = merge_starts([rec for _, rec in kept])
        case_rows(rows, spec, merged, job_suspect)
        start_rows(rows, merged, kept, repeated=len(starts) > 1)
    return first_env


def collect(run_dir: Path) -> RunRows:
    """Rows for every table, from the run directory alone (a file that is not as moelab wrote it is a
    RunDirFileError naming it; a bad results line is a failure of its case, stored)."""
    rd = RunDir(run_dir)
    spec = rd.spec
    info = rd.info()
    rows = RunRows(spec.run_id)
    env0: dict[str, Any] = {}
    for backend in spec.backends:
        first_env = backend_rows(rows, spec, rd, backend)
        env0 = env0 or first_env
    # written by `moelab verify`
    rows.tables["library_figures"] = [r.to_dict() for r in rd.library_figures()]
    for p in rd.peaks():
        rows.add("measured_peaks", name=p.name, gbps=p.gbps, bytes=p.bytes, definition=p.definition)
    for r in rd.rates():
        rows.add(
            "measured_rates", name=r.name, value=r.value, unit=r.unit, work=r.work, definition=r.definition
        )
    created = datetime.fromisoformat(spec.created_at).astimezone(timezone.utc).replace(tzinfo=None)
    rows.add(
        "runs",
        created_at=created,
        ingested_at=datetime.now(timezone.utc).replace(tzinfo=None),
        label=spec.label,
        suite=spec.suite,
        status=info.get("status", "unknown"),
        backends=list(spec.backends),
        command=" ".join(spec.command),
        device=spec.launch.device,
        world=spec.launch.world,
        nodes=spec.launch.nodes,
        gpus_per_node=spec.launch.gpus_per_node,
        moelab_version=env0.get("moelab_version"),
        git_sha=env0.get("moelab_git_sha"),
        run_dir=str(run_dir.resolve()),
        spec=_json(spec.to_dict()),
    )
    return rows


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[Row]) -> None:
    columns = list(rows[0])
    marks = ", ".join(["?"] * len(columns))
    con.executemany(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
        [[storable(r[c]) for c in columns] for r in rows],
    )


@dataclass(frozen=True, slots=True)
class Ingested:
    run_id: str
    problems: tuple[str, ...]  # lines of the run directory that were not records (stored as failures)


def ingest_run(con: duckdb.DuckDBPyConnection, run_dir: Path) -> Ingested:
    """Replace the run's rows with what its directory holds, atomically: on any failure (a full disk at
    COMMIT included) the store is as it was and the error names the first cause."""
    rows = collect(run_dir)
    run_id = rows.run_id
    with transaction(con, f"storing run {run_id}"):
        for table in RUN_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        for table, table_rows in rows.tables.items():
            if table_rows:
                _insert(con, table, table_rows)
        for name, text in rows.definitions.items():
            con.execute("INSERT OR REPLACE INTO definitions VALUES (?, ?)", [name, storable(text)])
        insert_samples(con, run_id, rows.samples)
    return Ingested(str(run_id), tuple(rows.problems))


def ingest(con: duckdb.DuckDBPyConnection, run_dir: Path) -> str:
    """`ingest_run`, returning the run id."""
    return ingest_run(con, run_dir).run_id
