"""The second pass's concurrent commands and old stores (issue 41), as rows of the hostile table.

Concurrent: two `moelab run` into one store at once, `moelab ingest` of one run directory twice at once,
`report`, `compare` and `db export` while a run measures and stores. Nothing is lost, each run is stored
once, the command that loses a race waits or says so in one line, and none prints a traceback.

Old stores (schema versions 1, 3 and 7, as older moelabs left them): the read-only commands refuse them
with the command that migrates; a write command migrates once, says so, and keeps the stored runs. Importing
this module adds its rows to `CASES`."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from moelab.store.schema import LATEST_VERSION
from tests.argv import with_flags
from tests.hostile.cases import Argv, case, with_db
from tests.hostile.world import NEW_RUN, Outcome, World, rows_of
from tests.launch.test_crash_isolation import SMALL


def _run_argv(w: World, run_id: str) -> list[str]:
    return ["run", "--cpu", *with_flags(SMALL, "--iters", "30"), "--no-health", "--run-id", run_id,
            "--db", str(w.db), "--out", str(w.runs)]  # fmt: skip


def _measuring(w: World, run_id: str) -> Callable[[], bool]:
    """Ready once the run's first case is written: it measures, and stores at its end."""
    results = w.runs / run_id / "nccl-a2a" / "results.jsonl"
    return lambda: results.exists() and bool(results.read_text().strip())


def _beside(w: World, *argvs: list[str]) -> Callable[[subprocess.Popen[bytes]], None]:
    """An act: each command started from a second shell while the case's own runs, then waited for."""

    def act(_proc: subprocess.Popen[bytes]) -> None:
        started = [w.start(argv) for argv in argvs]
        w.others += [w.finish(p) for p in started]

    return act


def _others_fine(says: str = "") -> Callable[[World, Outcome], None]:
    def check(w: World, out: Outcome) -> None:
        assert w.others
        for other in w.others:
            said = f"exit {other.code}\nstdout: {other.stdout[-2000:]}\nstderr: {other.stderr[-2000:]}"
            assert other.code == 0 and not other.error_lines, said
            assert "Traceback" not in other.stdout + other.stderr, said
            assert says in other.stdout, said

    return check


@case("two-runs-into-one-store-at-once", "concurrent", 0, "ok", "stored run r-a", store="once",
      once=("r-a", "r-b"), via="during", slow=True, check=_others_fine("stored run r-b"))  # fmt: skip
def _two_runs(w: World) -> Argv:
    w.ready = 0.5  # both start together: one stores while the other waits for the store's lock
    w.act = _beside(w, _run_argv(w, "r-b"))
    return _run_argv(w, "r-a")


def _one_stored(w: World, out: Outcome) -> None:
    _others_fine()(w, out)
    said = [o.stdout for o in (out, *w.others)]
    assert sum("already stored" in s for s in said) == 1, (
        said
    )  # the loser of the race says so, stores nothing
    assert sum(f"stored run {NEW_RUN}" in s for s in said) == 1, said


@case("ingest-one-run-directory-twice-at-once", "concurrent", 0, "ok", "", store="once", once=NEW_RUN,
      via="during", check=_one_stored)  # fmt: skip
def _ingest_twice(w: World) -> Argv:
    w.ready = 0.0
    w.act = _beside(w, ["ingest", str(w.new_run), "--db", str(w.db)])
    return ["ingest", str(w.new_run), "--db", str(w.db)]


for _name, _reader, _says in (
    ("report", ["report", "-o", "r.html"], "report: "),
    ("compare", ["compare", "--run", "r1", "--run", "r2", "--by", "run"], ""),
    ("db-export", ["db", "export", "--out", "exported"], "manifest.json"),
):

    def _while_a_run_writes(w: World, reader: list[str] = _reader) -> Argv:
        w.ready = _measuring(w, "r-w")
        w.act = _beside(w, [*reader, "--db", str(w.db)])
        w.outputs += [w.path("r.html"), w.path("exported")]
        return _run_argv(w, "r-w")

    case(f"{_name}-while-a-run-writes", "concurrent", 0, "ok", "stored run r-w", store="once", once="r-w",
         via="during", slow=True, check=_others_fine(_says))(_while_a_run_writes)  # fmt: skip


# --- old stores ---------------------------------------------------------------------------------------------

for _v in (1, 3, 7):
    for _name, _cmd in (
        ("runs", ["runs"]),
        ("report", ["report", "-o", "r.html"]),
        ("compare", ["compare"]),
        ("query", ["db", "query", "SELECT 1"]),
        ("export", ["db", "export", "--out", "e"]),
        ("check", ["check", "--baseline", "old-1"]),
    ):

        def _refused(w: World, v: int = _v, cmd: list[str] = _cmd) -> Argv:
            return with_db(w, w.db_at_version(v), *cmd)

        case(f"old-store-{_name}-refused-v{_v}", "store", 2, "error", "moelab db migrate --db")(_refused)


def _migrated_once(w: World, out: Outcome) -> None:
    versions = rows_of(w.store, "SELECT version, count(*) FROM schema_version GROUP BY version ORDER BY 1")
    assert versions[-1] == (LATEST_VERSION, 1) and all(n == 1 for _, n in versions), versions
    assert rows_of(w.store, "SELECT run_id FROM runs WHERE run_id = 'old-1'") == [("old-1",)]
    notes = [line for line in out.stderr.splitlines() if "migrated from schema version" in line]
    assert len(notes) == 1 and "an older moelab" in notes[0], out.stderr  # it says so, once
    again = w.cli(["runs", "--db", str(w.store)])  # now read as this moelab's store, with no note
    assert again.code == 0 and "old-1" in again.stdout and "migrated" not in again.stderr, again


for _v in (1, 3, 7):

    def _label_old(w: World, v: int = _v) -> Argv:
        return with_db(w, w.db_at_version(v), "label", "old-1", "kept")

    def _ingest_old(w: World, v: int = _v) -> Argv:
        return with_db(w, w.db_at_version(v), "ingest", str(w.new_run))

    case(f"old-store-label-migrates-once-v{_v}", "store", 0, "ok", "old-1", store="migrated",
         check=_migrated_once)(_label_old)  # fmt: skip
    case(f"old-store-ingest-migrates-once-v{_v}", "store", 0, "ok", f"stored run {NEW_RUN}",
         store="migrated", check=_migrated_once)(_ingest_old)  # fmt: skip
