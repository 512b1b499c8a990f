"""Issue 41's cases whose proof is more than an exit code and a line, as rows of the hostile table (they were
standalone tests): the rank a failure headline blames, a run directory moved mid-run, Ctrl-C on an endless
query, `--list-cases` over 100,000 cases, strict JSON from `moelab model`, `--check-published` over no
tables, a rank's 80,005-character traceback line, ragged samples. Each row passes the table's five checks,
then its own `check`. Importing this module adds its rows to `CASES`."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ENTRY_POINTS, PLUGIN_SRC
from tests.hostile.cases import RUN_ARGS, Argv, case
from tests.hostile.second_pass import make_ragged
from tests.hostile.world import NEW_RUN, REPO, Outcome, World, rows_of
from tests.launch.test_crash_isolation import SMALL

# --- blame: the headline names the rank that caused the failure, not the peer that timed out waiting ------

KILLED = """

class KilledBackend(_OneBadRank):
    \"\"\"One rank is killed (SIGKILL, as the OOM killer does): it dies without a record.\"\"\"

    name = "test-killed"

    def misbehave(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class LongLineBackend(_OneBadRank):
    \"\"\"One rank raises with an 80,005-character message: its traceback holds one line that long.\"\"\"

    name = "test-long-line"

    def misbehave(self) -> None:
        raise RuntimeError("x" * 80_005)
"""


def misbehaving_plugins(w: World) -> None:
    """The test suite's misbehaving backends (tests/plugins), and two more, installed for the case's
    commands (their torchrun workers find them through PYTHONPATH)."""
    root = w.path("plugins")
    dist = root / "moelab_testplugins-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: moelab-testplugins\nVersion: 0.0\n")
    extra = "test-killed = moelab_testplugins:KilledBackend\ntest-long-line = moelab_testplugins:LongLineBackend\n"
    (dist / "entry_points.txt").write_text(ENTRY_POINTS + extra)
    (root / "moelab_testplugins.py").write_text(PLUGIN_SRC.read_text() + KILLED)
    w.env = {"PYTHONPATH": f"{root}{os.pathsep}{REPO}"}


def _bad_rank_run(w: World, backend: str) -> Argv:
    misbehaving_plugins(w)
    return ["run", "--backend", backend, "--cpu", "--run-id", "r-bad", "--timeout", "60",
            "--collective-timeout", "10", "--no-health", *SMALL, "--db", str(w.db), "--out", str(w.runs)]  # fmt: skip


def _blames(first: str) -> object:
    def check(w: World, out: Outcome) -> None:
        rows = rows_of(
            w.db,
            "SELECT rank, root_cause, headline FROM failure_diagnosis WHERE run_id = 'r-bad' ORDER BY rank",
        )
        assert rows and str(rows[0][2]).startswith(first), rows
        assert [r[0] for r in rows if r[1]] == [1], rows  # rank 1 is the cause, not rank 0 that waited
        assert f"cause: {first}" in out.stdout, out.stdout[-3000:]
        last = " ".join(out.stdout.split("error: run r-bad exits 1:")[-1].split())  # unwrapped
        assert "error: run r-bad exits 1:" in out.stdout and ": exit code" in last, out.stdout[-3000:]
        assert "every finished case is stored" in last, last  # the exit code's reason, under the tables

    return check


for _backend, _first in (
    ("test-stop", "rank 1 stopped first"),
    ("test-exit0", "rank 1 ended first, leaving no error"),
    ("test-killed", "rank 1"),
):

    def _bad_rank(w: World, backend: str = _backend) -> Argv:
        return _bad_rank_run(w, backend)

    case(f"blame-names-the-rank-{_backend.removeprefix('test-')}", "blame", 1, "failure", "",
         store="once", once="r-bad", via="proc", slow=True, check=_blames(_first))(_bad_rank)  # fmt: skip


def _lines_cut(w: World, out: Outcome) -> None:
    """The console wraps long lines, so what is measured is the message as printed: its longest run of the
    raised message's characters, with the console's line breaks taken out."""
    import re

    printed = (out.stdout + out.stderr).replace("\n", "")
    assert "RuntimeError: xxx" in printed, printed[-3000:]
    longest = max(len(m) for m in re.findall("x+", printed))
    assert longest <= 1_000, longest  # 80,005 before


@case("rank-traceback-80005-character-line-cut", "blame", 1, "failure", "", store="once", once="r-bad",
      via="proc", slow=True, check=_lines_cut)  # fmt: skip
def _long_line(w: World) -> Argv:
    return _bad_rank_run(w, "test-long-line")


# --- a run directory moved while the run goes on ------------------------------------------------------------


def _moved_paths(w: World) -> tuple[Path, Path]:
    return w.runs / "r-mv", w.path("moved", "r-mv")


def _moved_check(w: World, out: Outcome) -> None:
    old, new = _moved_paths(w)
    assert f"was moved to {new}" in out.error_lines[0] and f"moelab ingest {new}" in out.error_lines[0]
    assert not old.exists(), sorted(str(p) for p in old.rglob("*"))  # nothing re-created the old path
    assert (new / "spec.json").is_file()


@case("run-directory-moved-mid-run", "signals", 2, "error", "was moved to", via="during", slow=True,
      check=_moved_check)  # fmt: skip
def _moved(w: World) -> Argv:
    old, new = _moved_paths(w)
    w.ready = lambda: old.exists() and any(p.stat().st_size for p in old.rglob("results.jsonl"))
    w.act = lambda _proc: (new.parent.mkdir(), shutil.move(str(old), str(new)))  # a rename, as `mv` does
    w.outputs.append(new.parent)
    return ["run", *RUN_ARGS, "--repeat", "2", "--run-id", "r-mv", "--db", str(w.db), "--out", str(w.runs)]


# --- Ctrl-C on a query that never ends --------------------------------------------------------------------


def _stopped_at_once(w: World, out: Outcome) -> None:
    assert out.after_act_s is not None and out.after_act_s < 10, out.after_act_s


@case("query-never-ends-stopped-by-ctrl-c", "db", 130, "error", "interrupted", via="during", slow=True,
      check=_stopped_at_once)  # fmt: skip
def _endless_query(w: World) -> Argv:
    w.ready, w.signal = 6.0, signal.SIGINT  # by then inside DuckDB's call, which used to hold the signal
    endless = "SELECT count(*) FROM range(1000000000000) a, range(1000000000000) b"
    return ["db", "query", endless, "--db", str(w.db)]


# --- --list-cases over 100,000 cases ------------------------------------------------------------------------


def _listed_quickly(w: World, out: Outcome) -> None:
    lines = out.stdout.splitlines()
    assert lines[0].split("\t") == ["backend", "case", "workload", "plan"]
    assert sum(1 for line in lines if line.startswith("nccl-a2a\t")) == 100_000
    assert out.wall_s < 90, f"{out.wall_s:.0f} s"  # 15 s on a busy two-core machine; 4 min 5 s before


@case("list-cases-over-100k-cases", "plan", 0, "ok", "100000 cases (100000 to run", via="proc", slow=True,
      check=_listed_quickly)  # fmt: skip
def _big_suite(w: World) -> Argv:
    hidden = ", ".join(str(64 * i) for i in range(1, 101))
    tokens = ", ".join(str(i) for i in range(1, 1001))
    w.path("big.toml").write_text(f"[axes]\nhidden = [{hidden}]\ntokens_per_rank = [{tokens}]\n")
    return ["run", "--cpu", "--suite", str(w.path("big.toml")), "--experts-per-rank", "4", "--list-cases"]


# --- model: strict JSON, JSON alone ------------------------------------------------------------------------


def strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _json_alone(w: World, out: Outcome) -> None:
    doc = strict_json(out.stdout)  # the note about missing peaks went to stderr, not before the JSON
    assert isinstance(doc, dict) and doc["bounds"]
    assert "stored no measured peaks" in out.stderr


@case("model-from-run-json-prints-only-json", "model", 0, "ok", '"bounds"', check=_json_alone)
def _from_run_json(w: World) -> Argv:
    return ["model", "--from-run", "r1", "--experts-per-rank", "4", "--json", "--db", str(w.db)]


@case("model-json-strict-where-a-link-has-no-bound", "model", 0, "ok", '"bounds"',
      check=lambda w, out: strict_json(out.stdout) and None)  # fmt: skip
def _model_json(w: World) -> Argv:
    return ["model", "--json"]


def _nothing_checked_fails(w: World, out: Outcome) -> None:
    assert strict_json(out.stdout) == {"ok": False, "tables": [], "rows": []}


@case("model-check-published-over-no-tables", "model", 1, "error",
      "no published rows to check: the published tables are missing", check=_nothing_checked_fails)  # fmt: skip
def _no_tables(w: World) -> Argv:
    w.patches["moelab.model.published.dataset_paths"] = lambda: {}
    return ["model", "--check-published", "--json"]


# --- ragged samples: stored, marked suspect, said ----------------------------------------------------------


def _ragged_flagged(w: World, out: Outcome) -> None:
    assert "warning:" in out.stderr and "ragged samples" in out.stderr, out.stderr
    sql = "SELECT suspect_reason FROM cases WHERE run_id = ? AND suspect ORDER BY case_id"
    reasons = rows_of(w.db, sql, [NEW_RUN])
    assert len(reasons) == 1 and "rank 1 holds 1" in reasons[0][0], reasons


@case("ingest-ragged-samples-stored-and-flagged", "ingest", 0, "ok", "stored run r-new", store="once",
      once=NEW_RUN, check=_ragged_flagged)  # fmt: skip
def _ragged(w: World) -> Argv:
    make_ragged(w)
    return ["ingest", str(w.new_run), "--db", str(w.db)]


# --- an interrupted --repeat keeps the starts that finished --------------------------------------------------


def _stored_soon(w: World, out: Outcome) -> None:
    assert out.after_act_s is not None and out.after_act_s < 60, out.after_act_s  # nothing for 85 s before
    starts = rows_of(w.db, "SELECT status, count(*) FROM processes WHERE run_id = 'r-rep' GROUP BY 1")
    assert dict(starts).get("ok", 0) >= 2, starts
    assert rows_of(w.db, "SELECT status FROM runs WHERE run_id = 'r-rep'") == [("interrupted",)]


@case("run-repeat-1000-stopped-by-SIGINT", "signals", 130, "ok", "was interrupted", store="once",
      once="r-rep", via="during", slow=True, check=_stored_soon)  # fmt: skip
def _repeat_stopped(w: World) -> Argv:
    third = w.runs / "r-rep" / "nccl-a2a" / "r2" / "results.jsonl"  # two starts done, the third measuring
    w.ready, w.signal = third, signal.SIGINT
    return [
        "run",
        *RUN_ARGS,
        "--repeat",
        "1000",
        "--run-id",
        "r-rep",
        "--db",
        str(w.db),
        "--out",
        str(w.runs),
    ]


STARTS, FINISHED = 20, 14


def _finished_starts(w: World, out: Outcome) -> None:
    starts = rows_of(w.db, "SELECT repeat FROM processes WHERE run_id = 'r-rep' AND status = 'ok' ORDER BY 1")
    assert [r[0] for r in starts] == list(range(FINISHED)), starts
    assert out.wall_s < 60, out.wall_s  # nothing stored in 120 s before


@case("ingest-interrupted-repeat-keeps-the-finished-starts", "ingest", 0, "ok", "stored run r-rep",
      store="once", once="r-rep", check=_finished_starts)  # fmt: skip
def _interrupted_repeat(w: World) -> Argv:
    """A run of --repeat 20 whose launcher was stopped in its 15th start: 14 starts finished, the rest never
    began (as issue 41's run of --repeat 1000000 was left after SIGINT)."""
    from moelab.job.rundir import RunDir
    from tests.synthetic_runs import RunModel, write_run

    run_dir = write_run(w.runs, RunModel(run_id="r-rep", tokens=(256,), repeats=STARTS, iters=8))
    for k in range(FINISHED, STARTS):
        shutil.rmtree(run_dir / "nccl-a2a" / f"r{k}")
    RunDir(run_dir).set_status("interrupted", signal="SIGINT")
    return ["ingest", str(run_dir), "--db", str(w.db)]


# --- a trace registered in a run directory that is not what it says -----------------------------------------


def _traces(w: World, report: bytes, export: bytes | None, rel: str | None = None) -> None:
    """Rank 0's nsys report and SQLite export in the job's traces folder, registered in nsys_traces.json as
    the runner registers them (`export` None: a real SQLite export with a table)."""
    import sqlite3

    from moelab.job.rundir import JobFiles

    files = JobFiles(w.new_run, "nccl-a2a")
    folder = files.dir / "traces"
    folder.mkdir(exist_ok=True)
    rep, db = folder / "nccl-a2a_rank0.nsys-rep", folder / "nccl-a2a_rank0.sqlite"
    rep.write_bytes(report)
    if export is None:
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    else:
        db.write_bytes(export)
    rows = [
        {"rank": 0, "kind": "nsys", "path": rel or str(rep.relative_to(w.new_run)), "size_bytes": 1},
        {"rank": 0, "kind": "nsys-sqlite", "path": str(db.relative_to(w.new_run)), "size_bytes": 1},
    ]
    files.write_nsys_traces(rows, None)


def _registered_only(kind: str, warned: str) -> Callable[[World, Outcome], None]:
    def check(w: World, out: Outcome) -> None:
        warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and warned in warnings[0], out.stderr
        assert rows_of(w.db, "SELECT kind FROM traces WHERE run_id = ?", [NEW_RUN]) == [(kind,)]

    return check


GOOD_REPORT = b"NVIDIA Tegra Profiler Report 2024@6@1\n" + bytes(range(256))


@case("ingest-garbage-nsys-report-not-registered", "ingest", 0, "ok", "stored run r-new", store="once",
      once=NEW_RUN, check=_registered_only("nsys-sqlite", "nccl-a2a_rank0.nsys-rep is not an nsys report"))  # fmt: skip
def _garbage_report(w: World) -> Argv:
    _traces(w, os.urandom(5000), None)
    return ["ingest", str(w.new_run), "--db", str(w.db)]


@case("ingest-garbage-sqlite-export-not-registered", "ingest", 0, "ok", "stored run r-new", store="once",
      once=NEW_RUN, check=_registered_only("nsys", "nccl-a2a_rank0.sqlite is not an SQLite export"))  # fmt: skip
def _garbage_export(w: World) -> Argv:
    _traces(w, GOOD_REPORT, b"SQLite format 3\x00" + os.urandom(5000))
    return ["ingest", str(w.new_run), "--db", str(w.db)]


@case("ingest-trace-path-outside-the-run-directory", "ingest", 0, "ok", "stored run r-new", store="once",
      once=NEW_RUN, check=_registered_only("nsys-sqlite", "is not a path inside the run directory"))  # fmt: skip
def _trace_outside(w: World) -> Argv:
    _traces(w, GOOD_REPORT, None, rel="../r1/spec.json")
    return ["ingest", str(w.new_run), "--db", str(w.db)]


def _traces_linked(w: World, out: Outcome) -> None:
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all("traces is a symbolic link" in line for line in warnings), out.stderr
    assert rows_of(w.db, "SELECT count(*) FROM traces WHERE run_id = ?", [NEW_RUN]) == [(0,)]


@case("ingest-traces-folder-is-a-symlink", "ingest", 0, "ok", "stored run r-new", store="once",
      once=NEW_RUN, check=_traces_linked)  # fmt: skip
def _traces_folder_linked(w: World) -> Argv:
    _traces(w, GOOD_REPORT, None)
    folder = w.job("traces")
    shutil.move(str(folder), str(w.path("elsewhere")))
    folder.symlink_to(w.path("elsewhere"))  # what the registered paths name is read from another folder
    return ["ingest", str(w.new_run), "--db", str(w.db)]
