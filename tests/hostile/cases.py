"""The hostile-input table (issue 26): each row is one thing a user, a crash, a full disk or another program
does to moelab's inputs, the command that meets it, and what that command must do.

A row: `@case(id, area, code, expect, says, ...)` on a function that breaks the world and returns the
command's arguments. `expect` is "error" (exactly one `error:` line holding `says`, nothing else stored),
"failure" (the run stored once, a case of it failed with a reason holding `says`), or "ok" (`says` on stdout).
`store` is "unchanged" (every table of the store as before), "once" (each run of `once` stored exactly once,
every other row as before) or "migrated" (an older store a write command migrated: the row's `check` reads
it). Every row also leaves no file outside the run directories, the store and the outputs it names
(`World.outputs`), and no process behind; `check` adds what else it must show (a blamed rank, strict JSON, a
time). `via="during"` acts on the running command (`World.signal` or `World.act`, once `World.ready` holds).
Rows live here and in second_pass.py, checked_rows.py, concurrent_and_old.py and hunted.py; issue 41's list
of cases is walked by test_issue_41.py. Add a row for a new kind of input; a row that fails until someone
else's change lands is marked `xfail=...` with who (strict: it flips to a failure to fix the mark when that
change lands).
"""

from __future__ import annotations

import json
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.hostile.world import NEW_RUN, REPO, Outcome, World

Argv = list[Any]


@dataclass(frozen=True, slots=True)
class Hostile:
    id: str
    area: str
    make: Callable[[World], Argv]
    code: int
    expect: str  # "error" | "failure" | "ok"
    says: str
    store: str = "unchanged"  # | "once" | "migrated" (an older store migrated: `check` reads it)
    once: str | tuple[str, ...] | None = None  # the run (or runs) stored exactly once
    via: str = "cli"  # "cli" (CliRunner), "proc" (a `python -m moelab.cli.main` subprocess), "during" (a
    # subprocess the case acts on while it runs: World.signal or World.act once World.ready holds)
    slow: bool = False
    xfail: str | None = None
    check: Callable[[World, Outcome], None] | None = None  # what else the case must show

    @property
    def stored_once(self) -> tuple[str, ...]:
        return (self.once,) if isinstance(self.once, str) else tuple(self.once or ())


CASES: list[Hostile] = []


def case(
    id: str, area: str, code: int, expect: str, says: str, **kw: Any
) -> Callable[[Callable[[World], Argv]], Callable[[World], Argv]]:
    def add(fn: Callable[[World], Argv]) -> Callable[[World], Argv]:
        CASES.append(Hostile(id=id, area=area, make=fn, code=code, expect=expect, says=says, **kw))
        return fn

    return add


def ingest(w: World) -> Argv:
    return ["ingest", str(w.new_run), "--db", str(w.db)]


def with_db(w: World, path: Path, *argv: str) -> Argv:
    w.store = path
    return [*argv, "--db", str(path)]


def full_disk(limit: int) -> Callable[[], None]:
    """In the child: writes past `limit` bytes of any file fail with EFBIG, as on a full file system they fail
    with ENOSPC (SIGXFSZ ignored, so the write returns the error instead of killing the process)."""

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


# --- the store file itself: truncated, foreign, older, newer, not a file ---------------------------------

for _cmd in (
    ["runs"],
    ["report", "-o", "r.html"],
    ["compare"],
    ["check", "--baseline", "nightly"],
    ["label", "r1", "x"],
):
    for _cut, _says in ((100, "cannot open database"), (0.5, "is truncated")):

        def _truncated(w: World, cmd: list[str] = _cmd, n: float = _cut) -> Argv:
            return with_db(w, w.truncated_db(n), *cmd)

        case(f"truncated-db-{_cut}-{_cmd[0]}", "store", 2, "error", _says)(_truncated)


@case("truncated-db-ingest", "store", 2, "error", "is truncated")
def _truncated_ingest(w: World) -> Argv:
    return with_db(w, w.truncated_db(0.5), "ingest", str(w.new_run))


@case("truncated-db-run-refused-before-measuring", "store", 2, "error", "is truncated")
def _truncated_run(w: World) -> Argv:
    w.absent.append(w.runs / "r-trunc")
    return with_db(w, w.truncated_db(0.5), "run", "--cpu", "--run-id", "r-trunc", "--out", str(w.runs))


@case("sqlite-db-runs", "store", 2, "error", "not a DuckDB database")
def _sqlite_runs(w: World) -> Argv:
    return with_db(w, w.sqlite_db(), "runs")


@case("sqlite-db-query", "db", 2, "error", "moelab never installs DuckDB extensions")
def _sqlite_query(w: World) -> Argv:
    return with_db(w, w.sqlite_db(), "db", "query", "SELECT 1")


@case("sqlite-db-ingest", "store", 2, "error", "not a DuckDB database")
def _sqlite_ingest(w: World) -> Argv:
    return with_db(w, w.sqlite_db(), "ingest", str(w.new_run))


@case("foreign-duckdb-runs", "store", 2, "error", "is not a moelab database")
def _foreign_runs(w: World) -> Argv:
    return with_db(w, w.foreign_db(), "runs")


@case("foreign-duckdb-ingest-never-written-into", "store", 2, "error", "is not a moelab database")
def _foreign_ingest(w: World) -> Argv:
    return with_db(w, w.foreign_db(), "ingest", str(w.new_run))


@case("foreign-duckdb-label", "labels", 2, "error", "is not a moelab database")
def _foreign_label(w: World) -> Argv:
    return with_db(w, w.foreign_db(), "label", "r1", "main")


for _cmd in (
    ["report", "-o", "r.html"],
    ["compare"],
    ["runs"],
    ["db", "query", "SELECT 1"],
    ["check", "--baseline", "old-1"],
):

    def _older(w: World, cmd: list[str] = _cmd) -> Argv:
        return with_db(w, w.db_at_version(4), *cmd)

    case(f"older-db-{_cmd[0]}", "report", 2, "error", "moelab db migrate --db")(_older)


@case("newer-db-runs", "store", 2, "error", "newer than this moelab")
def _newer(w: World) -> Argv:
    return with_db(w, w.db_at_version(99), "runs")


@case("newer-db-ingest", "store", 2, "error", "newer than this moelab")
def _newer_ingest(w: World) -> Argv:
    return with_db(w, w.db_at_version(99), "ingest", str(w.new_run))


@case("empty-file-db", "store", 2, "error", "not a valid DuckDB database file")
def _empty_db(w: World) -> Argv:
    path = w.path("empty.duckdb")
    path.write_bytes(b"")
    return with_db(w, path, "runs")


@case("random-bytes-db", "store", 2, "error", "cannot open database")
def _random_db(w: World) -> Argv:
    path = w.path("random.duckdb")
    path.write_bytes(os.urandom(20_000))
    return with_db(w, path, "report", "-o", "r.html")


@case("db-is-a-directory", "store", 2, "error", "cannot open database")
def _dir_db(w: World) -> Argv:
    path = w.path("adir.duckdb")
    path.mkdir()
    return with_db(w, path, "ingest", str(w.new_run))


@case("db-under-a-file", "store", 2, "error", "")
def _db_under_file(w: World) -> Argv:
    (w.path("afile")).write_text("x")
    return ["ingest", str(w.new_run), "--db", str(w.path("afile", "m.duckdb"))]


@case("db-missing-query", "db", 2, "error", "no database at")
def _missing_db(w: World) -> Argv:
    return ["db", "query", "SELECT 1", "--db", str(w.path("none.duckdb"))]


# --- db query without --write ------------------------------------------------------------------------------

for _name, _sql, _says in (
    ("copy-to", "COPY runs TO '{root}/leak.csv'", "file system operations are disabled"),
    (
        "attach-other-rw",
        "ATTACH '{root}/other.duckdb' AS o (READ_WRITE)",
        "file system operations are disabled",
    ),
    (
        "attach-hard-link-then-delete",
        "ATTACH '{root}/hardlink.duckdb' AS h (READ_WRITE); DELETE FROM h.samples",
        "disabled",
    ),
    ("install-extension", "INSTALL sqlite", "disabled"),
    ("load-extension", "LOAD sqlite", "disabled"),
    ("turn-access-back-on", "SET enable_external_access = true", "locked"),
    ("delete", "DELETE FROM samples", "read-only"),
    ("create-table", "CREATE TABLE x AS SELECT 1 AS a", "read-only"),
    ("read-csv-of-a-path", "SELECT * FROM read_csv('/etc/hostname')", "disabled"),
    ("delete-after-select", "SELECT 1; DELETE FROM runs", "read-only"),
    ("export-database", "EXPORT DATABASE '{root}/dumped'", "disabled"),
    ("syntax-error", "SELEC nonsense", "query failed"),
):

    def _query(w: World, sql: str = _sql) -> Argv:
        os.link(w.db, w.path("hardlink.duckdb"))
        w.absent += [w.path("leak.csv"), w.path("other.duckdb"), w.path("dumped")]
        return ["db", "query", sql.format(root=w.root), "--db", str(w.db)]

    case(f"query-{_name}", "db", 2, "error", _says)(_query)


@case("query-select-works", "db", 0, "ok", "r1")
def _select(w: World) -> Argv:
    return ["db", "query", "SELECT run_id FROM runs ORDER BY run_id", "--db", str(w.db)]


# --- export and the gate's export baselines ----------------------------------------------------------------


@case("export-into-a-folder-of-other-files", "export", 2, "error", "not a moelab export")
def _export_other(w: World) -> Argv:
    out = w.path("notes")
    out.mkdir()
    (out / "README.md").write_text("mine")
    w.keep.append(out)
    return ["db", "export", "--out", str(out), "--db", str(w.db)]


@case("export-unknown-format", "export", 2, "error", "unknown export format")
def _export_fmt(w: World) -> Argv:
    return ["db", "export", "--out", str(w.path("e")), "--format", "xlsx", "--db", str(w.db)]


@case("export-unknown-run", "export", 2, "error", "no such run")
def _export_run(w: World) -> Argv:
    return ["db", "export", "--out", str(w.path("e")), "--run", "nope", "--db", str(w.db)]


@case("export-full-disk-keeps-the-old-export", "export", 2, "error", "File too large", via="proc")
def _export_full(w: World) -> Argv:
    old = w.export("export")
    w.keep.append(old)
    w.preexec = full_disk(4096)
    return ["db", "export", "--out", str(old), "--db", str(w.db)]


@case("gate-unknown-baseline", "gate", 2, "error", "neither a label nor a run id")
def _gate_unknown(w: World) -> Argv:
    return ["check", "--baseline", "nope", "--db", str(w.db)]


@case("gate-baseline-not-utf8", "gate", 2, "error", "not valid UTF-8")
def _gate_surrogate(w: World) -> Argv:
    return ["check", "--baseline", "main\udcff", "--db", str(w.db)]


@case("gate-export-without-manifest", "gate", 2, "error", "no manifest.json")
def _gate_no_manifest(w: World) -> Argv:
    folder = w.export()
    (folder / "manifest.json").unlink()
    return ["check", "--baseline", str(folder), "--db", str(w.db)]


@case("gate-export-version-99", "gate", 2, "error", "export version 99 is not 1")
def _gate_version(w: World) -> Argv:
    folder = w.export()
    w.edit_json(folder / "manifest.json", lambda m: m.update(export_version=99))
    return ["check", "--baseline", str(folder), "--db", str(w.db)]


@case("gate-export-mixing-two-exports", "gate", 2, "error", "does not match the export's manifest.json")
def _gate_mixed(w: World) -> Argv:
    folder, other = w.export(), w.export("other")
    (folder / "results.parquet").write_bytes((other / "samples.parquet").read_bytes())
    return ["check", "--baseline", str(folder), "--db", str(w.db)]


@case("gate-export-manifest-is-dev-zero", "gate", 2, "error", "manifest.json")
def _gate_dev_zero(w: World) -> Argv:
    folder = w.export()
    w.link(folder / "manifest.json", "/dev/zero")
    return ["check", "--baseline", str(folder), "--db", str(w.db)]


@case("gate-export-truncated-parquet-old-manifest", "gate", 2, "error", "not a readable parquet export table")
def _gate_truncated(w: World) -> Argv:
    folder = w.export()
    w.edit_json(folder / "manifest.json", lambda m: m.pop("files"))  # written before manifests held hashes
    table = folder / "results.parquet"
    table.write_bytes(table.read_bytes()[:100])
    return ["check", "--baseline", str(folder), "--db", str(w.db)]


# --- labels and run ids ------------------------------------------------------------------------------------

for _name, _args, _says in (
    ("label-not-utf8", ["r1", "bad\udcff"], "not valid UTF-8"),
    ("label-escape-sequence", ["r1", "a\x1b[31mred"], "control characters"),
    ("label-empty", ["r1", "  "], "cannot be empty"),
    ("label-too-long", ["r1", "x" * 300], "at most 200"),
    ("label-unknown-run", ["nope", "main"], "neither a label nor a run id"),
    ("label-run-not-utf8", ["r\udcff", "main"], "not valid UTF-8"),
    ("label-remove-not-utf8", ["--remove", "x\udcff"], "not valid UTF-8"),
):

    def _label(w: World, args: list[str] = _args) -> Argv:
        return ["label", *args, "--db", str(w.db)]

    case(_name, "labels", 2, "error", _says)(_label)


@case("run-label-bytes-under-lang-c", "labels", 2, "error", "not valid UTF-8", via="proc")
def _run_label_c(w: World) -> Argv:
    w.env = {"LANG": "C", "LC_ALL": "C"}
    return ["run", "--cpu", "--label", b"nightly\xff\xfe-x", "--db", str(w.db), "--out", str(w.runs)]


@case("run-id-bytes", "labels", 2, "error", "is not a plain name", via="proc")
def _run_id_bytes(w: World) -> Argv:
    return ["run", "--cpu", "--run-id", b"r\xff", "--db", str(w.db), "--out", str(w.runs)]


@case("run-label-newline", "labels", 2, "error", "control characters")
def _run_label_nl(w: World) -> Argv:
    return ["run", "--cpu", "--label", "a\nb", "--db", str(w.db), "--out", str(w.runs)]


# --- ingest: run directories broken the ways a crash, a copy or another program breaks them ---------------


def _spec(w: World) -> Path:
    return w.new_run / "spec.json"


for _name, _break, _says in (
    ("spec-is-a-list", lambda w: _spec(w).write_text("[]"), "expected an object, found list"),
    ("spec-truncated", lambda w: _spec(w).write_text(_spec(w).read_text()[:200]), "not valid JSON"),
    (
        "spec-version-99",
        lambda w: w.edit_json(_spec(w), lambda d: d.update(spec_version=99)),
        "run spec version 99, this moelab reads version 1",
    ),
    (
        "spec-without-cases",
        lambda w: w.edit_json(_spec(w), lambda d: d.pop("cases")),
        "not a run spec (KeyError",
    ),
    (
        "spec-cases-wrong-type",
        lambda w: w.edit_json(_spec(w), lambda d: d.update(cases="abc")),
        "not a run spec",
    ),
    ("spec-not-utf8", lambda w: _spec(w).write_bytes(b'{"run_id": "\xff"}'), "not UTF-8 text"),
    ("spec-symlink", lambda w: w.link(_spec(w), w.runs / "r1" / "spec.json"), "is a symbolic link"),
    ("spec-dev-zero", lambda w: w.link(_spec(w), "/dev/zero"), "is a symbolic link"),
    ("spec-fifo", lambda w: w.fifo(_spec(w)), "is not a regular file"),
    ("spec-huge", lambda w: os.truncate(_spec(w), 300 << 20), "larger than 256 MiB"),
    ("spec-deeply-nested", lambda w: _spec(w).write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
    (
        "run-json-truncated",
        lambda w: (w.new_run / "run.json").write_text('{"status": "comp'),
        "run.json: not valid JSON",
    ),
    (
        "run-json-version-99",
        lambda w: w.edit_json(w.new_run / "run.json", lambda d: d.update(rundir_version=99)),
        "run directory version 99, this moelab reads version 1",
    ),
    (
        "job-json-truncated",
        lambda w: w.job("job.json").write_text('{"returncode": 0, "desc'),
        "job.json: not valid JSON",
    ),
    ("job-json-is-a-list", lambda w: w.job("job.json").write_text("[1, 2]"), "job.json: expected an object"),
    (
        "job-json-field-type",
        lambda w: w.edit_json(w.job("job.json"), lambda d: d.update(failed_ranks=5)),
        "field 'failed_ranks' is a int",
    ),
    (
        "env-json-symlink",
        lambda w: w.link(w.job("env.json"), w.runs / "r1" / "nccl-a2a" / "env.json"),
        "env.json is a symbolic link",
    ),
    (
        "env-json-not-utf8",
        lambda w: w.job("env.json").write_bytes(b'[{"host": "\xfe"}]'),
        "env.json: not UTF-8 text",
    ),
    ("env-json-entries-not-objects", lambda w: w.job("env.json").write_text("[1]"), "expected an object"),
    (
        "results-version-99",
        lambda w: w.write_results(
            w.job("results.jsonl").read_bytes().replace(b'"version": 2', b'"version": 99')
        ),
        "case record version 99, this moelab reads version 2",
    ),
    (
        "results-symlink",
        lambda w: w.link(w.job("results.jsonl"), "/dev/zero"),
        "results.jsonl is a symbolic link",
    ),
    (
        "health-json-truncated",
        lambda w: w.job("health_before.json").write_text('{"host": '),
        "health_before.json: not valid JSON",
    ),
    (
        "nsys-traces-not-json",
        lambda w: w.job("nsys_traces.json").write_text("nsys?"),
        "nsys_traces.json: not valid JSON",
    ),
    (
        "contention-json-symlink",
        lambda w: w.link(w.job("contention.json"), "/etc/hostname"),
        "contention.json is a symbolic link",
    ),
    (
        "peaks-wrong-shape",
        lambda w: (w.new_run / "peaks.json").write_text('[{"name": 1}]'),
        "not a list of measured peaks",
    ),
    (
        "library-figures-wrong-shape",
        lambda w: (
            (w.new_run / "verify").mkdir(),
            (w.new_run / "verify" / "library_figures.json").write_text('{"a": 1}'),
        ),
        "expected a list",
    ),
):

    def _broken(w: World, brk: Callable[[World], Any] = _break) -> Argv:
        brk(w)
        return ingest(w)

    case(f"ingest-{_name}", "ingest", 2, "error", _says)(_broken)


@case("ingest-not-a-directory", "ingest", 2, "error", "not a run directory")
def _not_dir(w: World) -> Argv:
    return ["ingest", str(w.path("nothing-here")), "--db", str(w.db)]


@case("ingest-a-file", "ingest", 2, "error", "not a run directory")
def _a_file(w: World) -> Argv:
    return ["ingest", str(w.new_run / "spec.json"), "--db", str(w.db)]


@case("ingest-folder-without-spec", "ingest", 2, "error", "no spec.json")
def _no_spec(w: World) -> Argv:
    (w.new_run / "spec.json").unlink()
    return ingest(w)


def _second_record_cut(w: World) -> Argv:
    first, second = w.results_lines()
    w.write_results(first + b"\n" + second[: len(second) // 2])
    return ingest(w)


case("results-last-line-cut", "ingest", 0, "failure", "cut before its end", store="once", once=NEW_RUN)(
    _second_record_cut
)


@case(
    "results-cut-line-before-intact-records",
    "ingest",
    0,
    "failure",
    "line 1: not valid JSON",
    store="once",
    once=NEW_RUN,
)
def _first_cut(w: World) -> Argv:
    first, second = w.results_lines()
    w.write_results(first[: len(first) // 2] + b"\n" + second + b"\n")
    return ingest(w)


@case("results-line-not-utf8", "ingest", 0, "failure", "line 2: not UTF-8", store="once", once=NEW_RUN)
def _not_utf8(w: World) -> Argv:
    first, second = w.results_lines()
    w.write_results(first + b"\n" + second.replace(b'"status"', b'"st\xffatus"') + b"\n")
    return ingest(w)


@case(
    "results-line-is-a-list",
    "ingest",
    0,
    "failure",
    "left no readable record of this case",
    store="once",
    once=NEW_RUN,
)
def _list_line(w: World) -> Argv:
    first, _ = w.results_lines()
    w.write_results(b"[]\n" + first + b"\n")
    return ingest(w)


@case("rank-log-links-to-dev-zero", "ingest", 0, "ok", "stored run r-new", store="once", once=NEW_RUN)
def _log_zero(w: World) -> Argv:
    w.edit_json(w.job("job.json"), lambda d: d.update(returncode=1, description="rank 0 failed"))
    w.link(w.job("rank0.log"), "/dev/zero")
    w.link(w.job("rank1.log"), w.runs / "r1" / "spec.json")
    return ingest(w)


@case("rank-log-fifo", "ingest", 0, "ok", "stored run r-new", store="once", once=NEW_RUN)
def _log_fifo(w: World) -> Argv:
    w.edit_json(w.job("job.json"), lambda d: d.update(returncode=1, description="rank 0 failed"))
    w.fifo(w.job("rank0.log"))
    w.fifo(w.job("rank0.stack.txt"))
    return ingest(w)


@case("rank-error-200kb-message", "ingest", 0, "ok", "stored run r-new", store="once", once=NEW_RUN)
def _big_message(w: World) -> Argv:
    w.edit_json(w.job("job.json"), lambda d: d.update(returncode=1, description="rank 0 failed"))
    w.job("rank0.error.json").write_text(json.dumps({"type": "RuntimeError", "message": "x" * 200_000}))
    return ingest(w)


@case("progress-garbage", "ingest", 0, "ok", "stored run r-new", store="once", once=NEW_RUN)
def _progress(w: World) -> Argv:
    w.job("progress.jsonl").write_bytes(
        b'{"event": "setup", "what": "jit", "seconds": 1}\n\xff\xfe{{{\n[1]\n'
    )
    return ingest(w)


@case("ingest-full-disk-at-commit", "ingest", 2, "error", "File too large", via="proc")
def _ingest_full(w: World) -> Argv:
    w.preexec = full_disk(8192)  # the store file is larger already: its WAL cannot grow past 8 KB
    return ingest(w)


@case(
    "ingest-label-not-utf8-from-an-older-moelab",
    "ingest",
    0,
    "ok",
    "stored run r-new",
    store="once",
    once=NEW_RUN,
)
def _old_label(w: World) -> Argv:
    """A run directory whose label and command hold bytes that are not UTF-8 (written before labels were
    checked): its measurements are stored, the text escaped, rather than refused by DuckDB at the end."""
    w.edit_json(
        _spec(w), lambda d: d.update(label="nightly\udcff\udcfe-x", command=["moelab", "--out", "\udcff"])
    )
    return ingest(w)


@case("ingest-twice-stores-once", "ingest", 0, "ok", "already stored", store="once", once="r1")
def _twice(w: World) -> Argv:
    return ["ingest", str(w.runs / "r1"), "--db", str(w.db)]


# --- reports and comparisons -------------------------------------------------------------------------------


@case("report-unknown-run", "report", 2, "error", "nope")
def _report_run(w: World) -> Argv:
    return ["report", "--run", "nope", "-o", str(w.path("r.html")), "--db", str(w.db)]


@case("report-under-a-file", "report", 2, "error", "cannot write report")
def _report_out(w: World) -> Argv:
    w.path("afile").write_text("x")
    return ["report", "-o", str(w.path("afile", "r.html")), "--db", str(w.db)]


@case("report-history-with-a-nan-median", "report", 0, "ok", "history", store="unchanged")
def _nan(w: World) -> Argv:
    import duckdb

    con = duckdb.connect(str(w.db))
    con.execute("UPDATE results SET median_us = 'nan'::DOUBLE WHERE run_id = 'r1' AND op = 'dispatch'")
    con.close()
    w.outputs.append(w.path("history.html"))
    return ["report", "--history", "-o", str(w.path("history.html")), "--db", str(w.db)]


@case("compare-unknown-grouping", "report", 2, "error", "cannot compare by 'nonsense'")
def _compare_by(w: World) -> Argv:
    return ["compare", "--by", "nonsense", "--db", str(w.db)]


@case("doctor-save-into-a-missing-folder", "report", 2, "error", "No such file or directory")
def _doctor_save(w: World) -> Argv:
    save = w.path("no", "such", "node.json")
    return ["doctor", "--load-ms", "0", "--sysfs-root", str(w.root), "--save", str(save)]


# --- suite files (validated by moelab/suites/loader.py) ------------------------------------------------------


def _suite(w: World, text: str | bytes) -> Argv:
    path = w.path("suite.toml")
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return ["run", "--cpu", "--suite", str(path), "--dry-run", "--db", str(w.db), "--out", str(w.runs)]


for _name, _text, _says, _xfail in (
    ("suite-toml-syntax", "[workload\nhidden = 1", "suite", None),
    ("suite-seed-is-a-string", '[workload]\nseed = "abc"\n', "seed", None),
    ("suite-deeply-nested", "x = " + "[" * 5000 + "]" * 5000 + "\n", "suite", None),
    ("suite-not-utf8", b"[workload]\nhidden = \xff\n", "suite", None),
):

    def _bad_suite(w: World, text: str | bytes = _text) -> Argv:
        return _suite(w, text)

    case(_name, "suite", 2, "error", _says, xfail=_xfail)(_bad_suite)


@case("suite-dev-zero", "suite", 2, "error", "suite", via="proc", slow=True)
def _suite_zero(w: World) -> Argv:
    w.preexec = _memory_cap
    return ["run", "--cpu", "--suite", "/dev/zero", "--dry-run", "--db", str(w.db), "--out", str(w.runs)]


def _memory_cap() -> None:
    resource.setrlimit(
        resource.RLIMIT_AS, (4 << 30, 4 << 30)
    )  # a suite read without bound dies here, not the CI host


@case("suite-missing-file", "suite", 2, "error", "suite")
def _suite_missing(w: World) -> Argv:
    return ["run", "--cpu", "--suite", str(w.path("nope.toml")), "--dry-run", "--db", str(w.db)]


# --- plugins ---------------------------------------------------------------------------------------------


def broken_plugin(w: World, body: str) -> None:
    """A plugin registered under the entry-point group, whose module runs `body` when imported."""
    root = w.path("plugins")
    dist = root / "broken_plugin-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[moelab.backends]\nbroken = broken_plugin:Broken\n")
    (root / "broken_plugin.py").write_text(body)
    w.env = {"PYTHONPATH": f"{root}{os.pathsep}{REPO}"}


for _name, _body, _argv, _says in (
    (
        "plugin-import-raises-run",
        "raise RuntimeError('boom at import')\n",
        ["--dry-run"],
        "RuntimeError: boom",
    ),
    ("plugin-import-raises-run-real", "raise ValueError('bad config')\n", [], "ValueError: bad config"),
    ("plugin-not-a-backend", "Broken = 42\n", ["--dry-run"], "is not a moelab Backend class"),
):

    def _plugin(w: World, body: str = _body, extra: list[str] = _argv) -> Argv:
        broken_plugin(w, body)
        w.absent.append(w.runs / "r-plugin")
        return [
            "run",
            "--cpu",
            "--backend",
            "broken",
            "--run-id",
            "r-plugin",
            *extra,
            "--db",
            str(w.db),
            "--out",
            str(w.runs),
        ]

    case(_name, "plugins", 2, "error", _says, via="proc")(_plugin)


@case("plugin-import-raises-listing", "plugins", 0, "ok", "importing broken_plugin failed", via="proc")
def _plugin_listing(w: World) -> Argv:
    broken_plugin(w, "raise RuntimeError('boom at import')\n")
    return ["backends"]


# --- signals -----------------------------------------------------------------------------------------------

RUN_ARGS = ["--cpu", "--hidden", "256", "--tokens-per-rank", "64,72,80", "--experts-per-rank", "4"]
RUN_ARGS += [
    "--topk",
    "2",
    "--sms",
    "default",
    "--warmup",
    "2",
    "--iters",
    "200",
    "--no-health",
    "--timeout",
    "150",
]

for _sig, _code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):

    def _stopped(w: World, sig: signal.Signals = _sig) -> Argv:
        w.signal = sig
        w.ready = w.runs / "r-sig" / "nccl-a2a" / "results.jsonl"
        return ["run", *RUN_ARGS, "--run-id", "r-sig", "--db", str(w.db), "--out", str(w.runs)]

    case(
        f"run-stopped-by-{_sig.name}",
        "signals",
        _code,
        "ok",
        "was interrupted",
        store="once",
        once="r-sig",
        via="during",
        slow=True,
    )(_stopped)
