"""Rows no case of issue 41 names, found by looking for its classes on other inputs: a count without a
bound (`--sms`, `runs --limit`, `doctor --load-ms`), a name printed raw (a run directory's run id or backend
from a spec.json moelab did not write), a file outside the run directory (a case record's trace path), a
command that changes a store it then refuses to use (`db import` of a folder that is not an export). Importing this module adds its rows to `CASES`."""

from __future__ import annotations

import json

from tests.hostile.cases import Argv, case, with_db
from tests.hostile.world import NEW_RUN, Outcome, World, rows_of


def _plan(w: World, *extra: str) -> Argv:
    w.absent.append(w.runs / "r-big")
    return ["run", "--cpu", "--run-id", "r-big", *extra, "--dry-run", "--db", str(w.db), "--out", str(w.runs)]


# --- counts without a bound --------------------------------------------------------------------------------


@case("run-sms-100-billion", "plan", 2, "error", "sms must be a whole number from 1 to 1,024")
def _sms_flag(w: World) -> Argv:
    return _plan(w, "--sms", "100000000000")  # planned, measured as unsupported, then refused by the store


@case("suite-sms-100-billion", "suite", 2, "error", "sms must be a whole number from 1 to 1,024")
def _sms_suite(w: World) -> Argv:
    w.path("suite.toml").write_text("[axes]\nsms = [32, 100000000000]\n")
    return _plan(w, "--suite", str(w.path("suite.toml")))


for _name, _value in (("negative", "-1"), ("int128", "100000000000000000000"), ("zero", "0")):

    def _limit(w: World, value: str = _value) -> Argv:
        return ["runs", "--limit", value, "--db", str(w.db)]  # a DuckDB binder error before

    case(f"runs-limit-{_name}", "db", 2, "error", "--limit must be a whole number from 1 to 100,000")(_limit)


for _name, _value in (("nan", "nan"), ("inf", "inf"), ("a-day", "86400000")):

    def _load(w: World, value: str = _value) -> Argv:
        return ["doctor", "--load-ms", value, "--sysfs-root", str(w.root)]  # nan and a day were accepted

    case(f"doctor-load-ms-{_name}", "report", 2, "error", "--load-ms must be a number from 0 to 60,000")(
        _load
    )


# --- names from a run directory moelab did not write --------------------------------------------------------

for _name, _key, _value, _says in (
    ("run-id-holds-esc", "run_id", "r\x1b[31mnew", "its run id"),
    ("run-id-is-a-path", "run_id", "../../r1", "its run id"),
    ("backend-is-a-path", "backends", ["../r1/nccl-a2a"], "its backend"),
):

    def _spec_name(w: World, key: str = _key, value: object = _value) -> Argv:
        w.edit_json(w.new_run / "spec.json", lambda d: d.update({key: value}))
        return ["ingest", str(w.new_run), "--db", str(w.db)]

    case(f"ingest-spec-{_name}", "ingest", 2, "error", f"{_says} ")(_spec_name)


@case("ingest-job-folder-is-a-symlink", "ingest", 2, "error", "is a symbolic link: moelab reads the folders")
def _job_folder_linked(w: World) -> Argv:
    import shutil

    shutil.rmtree(w.new_run / "nccl-a2a")
    (w.new_run / "nccl-a2a").symlink_to(w.runs / "r1" / "nccl-a2a")  # stored r1's job as r-new's, whole
    return ["ingest", str(w.new_run), "--db", str(w.db)]


# --- a refused import leaves the store as it was --------------------------------------------------------------


@case("db-import-not-an-export-into-an-older-store", "store", 2, "error", "is not a moelab export")
def _import_old(w: World) -> Argv:
    w.path("notes").mkdir()
    return with_db(w, w.db_at_version(4), "db", "import", str(w.path("notes")))  # it migrated, then refused


@case("db-import-not-an-export-creates-no-store", "store", 2, "error", "is not a moelab export")
def _import_new(w: World) -> Argv:
    w.path("notes").mkdir()
    w.absent.append(w.path("new"))
    return ["db", "import", str(w.path("notes")), "--db", str(w.path("new", "m.duckdb"))]


# --- a trace a case record registers outside its run directory -----------------------------------------------


def _trace_outside_said(w: World, out: Outcome) -> None:
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "is not a path inside the run directory" in warnings[0], out.stderr
    assert rows_of(w.db, "SELECT count(*) FROM traces WHERE run_id = ?", [NEW_RUN]) == [(0,)]


@case("ingest-case-record-trace-outside-the-run-directory", "ingest", 0, "ok", "stored run r-new",
      store="once", once=NEW_RUN, check=_trace_outside_said)  # fmt: skip
def _record_trace_outside(w: World) -> Argv:
    first, *rest = w.results_lines()
    record = json.loads(first)
    record["traces"] = [{"rank": 0, "kind": "torch", "path": "../../r1/spec.json", "size_bytes": 1}]
    w.write_results(b"\n".join([json.dumps(record).encode(), *rest]) + b"\n")
    return ["ingest", str(w.new_run), "--db", str(w.db)]  # the report linked the path as given


# --- paths a user gives, printed back: escaped wherever the console prints them --------------------------------

ESC_NAME = "e\x1b]0;pwn\x07\x1b[31m"


@case("run-dry-run-out-path-holds-esc", "report", 0, "ok", "moelab.measure.worker")
def _out_esc(w: World) -> Argv:
    return ["run", "--cpu", "--dry-run", "--out", str(w.path(ESC_NAME)), "--db", str(w.db)]


@case("runs-db-path-holds-esc", "db", 0, "ok", "no database at")
def _db_esc(w: World) -> Argv:
    return ["runs", "--db", str(w.path(f"{ESC_NAME}.duckdb"))]


@case("report-out-path-holds-esc", "report", 0, "ok", "report: ")
def _report_esc(w: World) -> Argv:
    w.outputs.append(w.path("rep"))
    return ["report", "-o", str(w.path("rep", f"{ESC_NAME}.html")), "--db", str(w.db)]


# --- sizes of the end-to-end layer and tune's grid --------------------------------------------------------------

for _knob, _value, _says in (
    ("intermediate", 100_000_000_000, "e2e knob intermediate 100000000000 is above the largest supported"),
    ("chunks", 100_000_000, "e2e knob chunks 100000000 is above the largest supported"),
    ("carveout", 100_000_000_000, "e2e knob carveout must be auto or a number of SMs from 0 to 1,024"),
):

    def _e2e_knob(w: World, knob: str = _knob, value: int = _value) -> Argv:
        text = f'[backend.nccl-a2a.axes]\nbench = ["e2e"]\nmode = ["chunked"]\n{knob} = [{value}]\n'
        w.path("suite.toml").write_text(text)
        return _plan(w, "--suite", str(w.path("suite.toml")))

    case(f"suite-e2e-{_knob}-unbounded", "suite", 2, "error", _says)(_e2e_knob)


def _tune(w: World, *extra: str) -> Argv:
    w.absent.append(w.path("tune-runs"))
    return ["tune", "--cpu", *extra, "--db", str(w.db), "--out", str(w.path("tune-runs"))]


@case("tune-intermediate-100-billion", "plan", 2, "error", "e2e knob intermediate 100000000000 is above")
def _tune_intermediate(w: World) -> Argv:
    return _tune(w, "--intermediate", "100000000000")  # every job of round 1 ran and failed before


@case("tune-sms-100-million", "plan", 2, "error", "--sms takes whole numbers from 1 to 1,024")
def _tune_sms(w: World) -> Argv:
    return _tune(w, "--sms", "100000000")
