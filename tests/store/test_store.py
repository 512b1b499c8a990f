"""The DuckDB store: migrations are idempotent, ingest of a run directory is all-or-nothing and replaces a
run's rows, exports round-trip, and a second writer waits for the lock and then fails with one line.

Run directories here are written the way workers write them (moelab.job.rundir, moelab.core.spec, one
results.jsonl record per case in worker.run_case's format), without torch processes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from moelab.core.bandwidth import bandwidths, count_rows
from moelab.core.case_record import CaseRecord, CheckResult
from moelab.core.errors import MoelabError
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.routing import route_all
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec, TimingSpec
from moelab.core.stats import summarize
from moelab.core.workload import Workload
from moelab.job.rundir import RunDir
from moelab.store.db import connect, migrate
from moelab.store.export import FORMATS, export_runs, load_export
from moelab.store.ingest import ingest
from moelab.store.schema import EXPORT_TABLES, LATEST_VERSION, MIGRATIONS, RUN_TABLES
from moelab.suites.loader import case_id_for

WORLD = 4
GPUS_PER_NODE = 2
ITERS = 3
WL = Workload(hidden=128, tokens_per_rank=16, topk=2, experts_per_rank=2)
BYTES = {"dispatch": 256, "combine": 256, "roundtrip": 512}


def _samples(op: str, scale: float) -> list[list[float]]:
    base = {"dispatch": 100.0, "combine": 80.0, "roundtrip": 200.0}[op]
    return [[scale * (base + 10 * rank + it) for it in range(ITERS)] for rank in range(WORLD)]


def _record(case: CaseSpec, scale: float) -> CaseRecord:
    rows = tuple(count_rows(route_all(case.workload, WORLD), case.workload.experts_per_rank, GPUS_PER_NODE))
    ops = tuple(
        op_result(OpMeasurement(op=op, samples_us=_samples(op, scale), bytes_per_row=BYTES[op]), rows)
        for op in BYTES
    )
    return CaseRecord(
        case=case, status="ok", world=WORLD, gpus_per_node=GPUS_PER_NODE, backend_record={"comm_backend": "gloo"},
        check=CheckResult(dispatch_err=0.0, combine_err=0.0), ops=ops, rows=rows, host_sync="none",
    )  # fmt: skip


def write_run(root: Path, run_id: str, scale: float = 1.0) -> Path:
    ok = CaseSpec(case_id=case_id_for(WL, None, {}), backend="nccl-a2a", workload=WL)
    bad_wl = dataclasses.replace(WL, topk=16)
    skipped = CaseSpec(
        case_id=case_id_for(bad_wl, None, {}), backend="nccl-a2a", workload=bad_wl,
        skip_reason="topk 16 > total experts 8 (4 ranks x 2 experts/rank): use --experts-per-rank >= 4 or >= 8 ranks",
    )  # fmt: skip
    spec = RunSpec(
        run_id=run_id, created_at="2026-11-22T07:00:00+00:00", suite="test", backends=("nccl-a2a",),
        cases=(ok, skipped), timing=TimingSpec(warmup=0, iters=ITERS),
        launch=LaunchSpec(device="cpu", nproc_per_node=GPUS_PER_NODE, nodes=2, gpus_per_node=GPUS_PER_NODE),
        command=("moelab", "run", "--cpu"),
    )  # fmt: skip
    rd = RunDir.create(root, spec)
    files = rd.job("nccl-a2a")
    files.write_env(
        [{"rank": r, "node": r // GPUS_PER_NODE, "host": f"host{r // GPUS_PER_NODE}", "torch": "2.13.0",
          "python": "3.11.7", "moelab_version": "0.1.0", "library_versions": {"torch": "2.13.0"}}
         for r in range(WORLD)]
    )  # fmt: skip
    files.write_job({"backend": "nccl-a2a", "argv": ["torchrun"], "returncode": 0, "signal": None,
                     "timed_out": False, "duration_s": 3.0, "failed_ranks": [], "stderr_tails": {}})  # fmt: skip
    files.append_result(_record(ok, scale))
    assert skipped.skip_reason is not None
    files.append_result(
        CaseRecord.skipped(skipped, skipped.skip_reason, world=WORLD, gpus_per_node=GPUS_PER_NODE)
    )
    rd.set_status("complete")
    return rd.path


def _rewrite_ok_record(run_dir: Path, change: Any) -> None:
    results = run_dir / "nccl-a2a" / "results.jsonl"
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    for rec in lines:
        if rec["status"] == "ok":
            change(rec)
    results.write_text("".join(json.dumps(rec) + "\n" for rec in lines))


def _snapshot(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[Any, ...]]]:
    """Every run table's rows, sorted; JSON columns parsed, so only their content counts, not spacing."""
    out = {}
    for table in RUN_TABLES:
        cols = [(r[0], r[1]) for r in con.execute(f"DESCRIBE {table}").fetchall() if r[0] != "ingested_at"]
        rows = con.execute(f"SELECT {', '.join(name for name, _ in cols)} FROM {table}").fetchall()
        parsed = [
            tuple(
                json.loads(v) if kind == "JSON" and v is not None else v
                for (_, kind), v in zip(cols, row, strict=True)
            )
            for row in rows
        ]
        out[table] = sorted(parsed, key=lambda r: json.dumps(r, default=str, sort_keys=True))
    return out


def _count(con: duckdb.DuckDBPyConnection, table: str, run_id: str | None = None) -> int:
    sql = f"SELECT count(*) FROM {table}" + (" WHERE run_id = ?" if run_id else "")
    row = con.execute(sql, [run_id] if run_id else []).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def con(tmp_path: Path) -> Any:
    c = connect(tmp_path / "db" / "moelab.duckdb")
    yield c
    c.close()


def test_migrations_apply_twice_as_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    c = connect(path)
    first = c.execute(
        "SELECT version, description, applied_at FROM schema_version ORDER BY version"
    ).fetchall()
    c.close()
    assert [r[0] for r in first] == [m.version for m in MIGRATIONS] and first[-1][0] == LATEST_VERSION
    c = connect(path)
    assert migrate(c) == LATEST_VERSION
    again = c.execute(
        "SELECT version, description, applied_at FROM schema_version ORDER BY version"
    ).fetchall()
    tables = {r[0] for r in c.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    c.close()
    assert again == first
    assert set(RUN_TABLES) | {"schema_version", "definitions", "labels"} <= tables


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.duckdb"
    c = connect(path)
    c.execute(
        "INSERT INTO schema_version (version, description) VALUES (?, 'from the future')",
        [LATEST_VERSION + 1],
    )
    c.close()
    for read_only in (True, False):
        with pytest.raises(MoelabError, match="newer than this moelab") as info:
            connect(path, read_only=read_only)
        assert "\n" not in str(info.value)


def test_ingest_of_a_run_directory(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    run_dir = write_run(tmp_path / "runs", "run-a")
    assert ingest(con, run_dir) == "run-a"
    assert con.execute("SELECT world, nodes, gpus_per_node, status, backends FROM runs").fetchall() == [
        (WORLD, 2, GPUS_PER_NODE, "complete", ["nccl-a2a"])
    ]
    cases = dict(con.execute("SELECT status, reason FROM cases ORDER BY status").fetchall())
    assert set(cases) == {"ok", "skipped"} and "topk 16" in cases["skipped"]
    assert _count(con, "samples") == len(BYTES) * WORLD * ITERS
    assert sorted(r[0] for r in con.execute("SELECT DISTINCT rank FROM environment").fetchall()) == [
        0,
        1,
        2,
        3,
    ]
    rows = count_rows(route_all(WL, WORLD), WL.experts_per_rank, GPUS_PER_NODE)
    for op in BYTES:
        s = summarize(_samples(op, 1.0))
        got = con.execute(
            "SELECT n, median_us, p90_us, rank_spread_us FROM results WHERE op = ?", [op]
        ).fetchone()
        assert got == pytest.approx((ITERS, s.median_us, s.p90_us, s.rank_spread_us))
        stored = dict(
            con.execute("SELECT definition, bytes_mean FROM bandwidths WHERE op = ?", [op]).fetchall()
        )
        for bw in bandwidths(rows, BYTES[op], s.median_us):
            assert stored[bw.definition] == pytest.approx(bw.bytes_mean)


def test_ingest_stores_the_measured_rates(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    """RUN_DIR/rates.json (a GPU run's dense matmul and copy rates, the e2e roofline's) into measured_rates."""
    from tests.e2e.test_roofline import rates_file

    run_dir = write_run(tmp_path / "runs", "run-a")
    rates_file(run_dir)
    ingest(con, run_dir)
    got = con.execute("SELECT name, value, unit, work FROM measured_rates ORDER BY name").fetchall()
    assert got == [("dense_bf16_matmul", 800.0, "TFLOP/s", 1.0), ("hbm_copy", 3000.0, "GB/s", 2.0)]


def test_reingest_replaces_the_run_and_only_it(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    run_a = write_run(tmp_path / "runs", "run-a")
    ingest(con, run_a)
    ingest(con, write_run(tmp_path / "runs", "run-b"))
    before_b = {t: _count(con, t, "run-b") for t in RUN_TABLES}
    counts_a = {t: _count(con, t, "run-a") for t in RUN_TABLES}
    _rewrite_ok_record(run_a, lambda rec: rec.update(_record(CaseSpec(**_case_fields(rec)), 2.0).to_dict()))
    ingest(con, run_a)
    assert {t: _count(con, t, "run-a") for t in RUN_TABLES} == counts_a  # replaced, not doubled
    assert {t: _count(con, t, "run-b") for t in RUN_TABLES} == before_b
    median = con.execute(
        "SELECT run_id, median_us FROM results WHERE op = 'dispatch' ORDER BY run_id"
    ).fetchall()
    assert median == [("run-a", pytest.approx(2 * summarize(_samples("dispatch", 1.0)).median_us)),
                      ("run-b", pytest.approx(summarize(_samples("dispatch", 1.0)).median_us))]  # fmt: skip


def _bad_type_inside_transaction(rec: dict[str, Any]) -> None:
    # passes collect(); the INSERT into results (INTEGER column) fails after the run's old rows were deleted
    rec["rows"] = []
    next(op for op in rec["ops"] if op["op"] == "roundtrip")["bytes_per_row"] = "many"


def _missing_ops(rec: dict[str, Any]) -> None:
    del rec["ops"]


def _unknown_version(rec: dict[str, Any]) -> None:
    rec["version"] = 99


@pytest.mark.parametrize(
    ("corrupt", "error"),
    [
        (_bad_type_inside_transaction, "storing run run-a failed, nothing was stored: Conversion Error"),
        (_unknown_version, "line 1: case record version 99, this moelab reads version 2"),
    ],
)
def test_ingest_is_atomic(tmp_path: Path, con: duckdb.DuckDBPyConnection, corrupt: Any, error: str) -> None:
    run_a = write_run(tmp_path / "runs", "run-a")
    ingest(con, run_a)
    ingest(con, write_run(tmp_path / "runs", "run-b"))
    before = _snapshot(con)
    assert before["results"] and before["samples"]
    _rewrite_ok_record(run_a, corrupt)
    with pytest.raises(MoelabError, match=error):
        ingest(con, run_a)
    assert _snapshot(con) == before
    # and the connection is usable afterwards: no transaction left open
    _rewrite_ok_record(run_a, lambda rec: rec.update(_record(CaseSpec(**_case_fields(rec)), 3.0).to_dict()))
    ingest(con, run_a)
    assert _count(con, "samples", "run-a") == len(BYTES) * WORLD * ITERS


def test_a_record_that_is_not_one_is_its_cases_failure(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    run_a = write_run(tmp_path / "runs", "run-a")
    _rewrite_ok_record(run_a, _missing_ops)
    ingest(con, run_a)
    ((status, reason),) = con.execute("SELECT status, reason FROM cases WHERE status <> 'skipped'").fetchall()
    assert status == "failed"
    assert reason.startswith("its record is unreadable: nccl-a2a/results.jsonl line 1: not a case record")
    assert "status ok with nothing measured" in reason


def _case_fields(rec: dict[str, Any]) -> dict[str, Any]:
    case = CaseSpec.from_dict(rec["case"])
    return {"case_id": case.case_id, "backend": case.backend, "workload": case.workload}


@pytest.mark.parametrize(
    "fmt",
    [
        "csv",
        "json",
        "parquet",
    ],
)
def test_export_round_trips(tmp_path: Path, con: duckdb.DuckDBPyConnection, fmt: str) -> None:
    ingest(con, write_run(tmp_path / "runs", "run-a"))
    ingest(con, write_run(tmp_path / "runs", "run-b", scale=1.5))
    written = export_runs(con, tmp_path / "export", fmt, ["run-b"])
    assert {p.name for p in written} == {f"{t}.{fmt}" for t in EXPORT_TABLES} | {"manifest.json"}
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert (manifest["format"], manifest["runs"], manifest["schema_version"]) == (
        fmt,
        ["run-b"],
        LATEST_VERSION,
    )
    fresh = duckdb.connect()
    migrate(fresh)
    assert load_export(fresh, tmp_path / "export") == ["run-b"]
    con.execute("DELETE FROM runs WHERE run_id = 'run-a'")  # compare run-b alone
    for table in RUN_TABLES:
        con.execute(f"DELETE FROM {table} WHERE run_id = 'run-a'")
    assert _snapshot(fresh) == _snapshot(con)
    fresh.close()


def test_export_refuses_unknown_runs_and_formats(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    assert sorted(FORMATS) == ["csv", "json", "parquet"]  # the formats test_export_round_trips covers
    ingest(con, write_run(tmp_path / "runs", "run-a"))
    with pytest.raises(MoelabError, match="no such run"):
        export_runs(con, tmp_path / "x", "parquet", ["run-zzz"])
    with pytest.raises(MoelabError, match="unknown export format"):
        export_runs(con, tmp_path / "x", "xlsx", None)
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "manifest.json").write_text(json.dumps({"export_version": 99, "format": "csv"}))
    with pytest.raises(MoelabError, match="export version 99"):
        load_export(duckdb.connect(), tmp_path / "y")


HOLDER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])
print("held", flush=True)
sys.stdin.readline()
con.close()
"""


@pytest.mark.slow
def test_a_second_writer_waits_then_fails_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "locked.duckdb"
    connect(path).close()
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        _wait_then_fail_then_enter(path, holder)


def _wait_then_fail_then_enter(path: Path, holder: subprocess.Popen[str]) -> None:
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(MoelabError) as info:
            connect(path, lock_wait_s=1.0)
        waited = time.monotonic() - t0
        msg = str(info.value)
        assert 1.0 <= waited < 8.0
        assert "\n" not in msg and msg.startswith(f"cannot open database {path}") and "lock" in msg.lower()

        # released while a writer waits: the writer gets in
        timer = threading.Timer(0.8, lambda: (holder.stdin.write("\n"), holder.stdin.flush()))  # type: ignore[union-attr]
        timer.start()
        t0 = time.monotonic()
        con = connect(path, lock_wait_s=20.0)
        waited = time.monotonic() - t0
        con.close()
        timer.join()
        assert 0.5 <= waited < 15.0
        assert holder.wait(timeout=10) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
