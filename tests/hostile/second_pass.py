"""The hostile-input table's second pass (issue 41): rows on exports, labels, bounds, plugins, the model, the
gate and signals that the first pass did not reach. Importing this module adds its rows to `CASES`."""

from __future__ import annotations

import signal

from tests.hostile.cases import RUN_ARGS, Argv, case, with_db
from tests.hostile.world import World

# --- exports: a folder moelab did not write is never replaced; labels travel; manifests are checked whole --


@case("export-over-a-foreign-manifest-and-index", "export", 2, "error", "not a moelab export")
def _export_foreign_manifest(w: World) -> Argv:
    out = w.path("site")
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my web app", "icons": []}')
    (out / "index.html").write_text("<h1>mine</h1>")
    w.keep.append(out)
    return ["db", "export", "--out", str(out), "--db", str(w.db)]


@case("export-over-an-export-holding-another-file", "export", 2, "error", "index.html")
def _export_extra_file(w: World) -> Argv:
    out = w.export()
    (out / "index.html").write_text("<h1>added by hand</h1>")
    w.keep.append(out)
    return ["db", "export", "--out", str(out), "--db", str(w.db)]


@case("export-force-replaces-a-foreign-folder", "export", 0, "ok", "manifest.json")
def _export_force(w: World) -> Argv:
    out = w.path("site")
    out.mkdir()
    (out / "index.html").write_text("<h1>mine</h1>")
    return ["db", "export", "--out", str(out), "--force", "--db", str(w.db)]


@case("export-carries-the-labels", "export", 0, "ok", "labels.parquet")
def _export_labels(w: World) -> Argv:
    return ["db", "export", "--out", str(w.path("e")), "--db", str(w.db)]


@case("gate-export-manifest-lists-a-run-no-file-holds", "gate", 2, "error", "that none of its files hold")
def _gate_ghost_run(w: World) -> Argv:
    folder = w.export()
    w.edit_json(folder / "manifest.json", lambda m: m["runs"].append("ghost"))
    return ["check", "--baseline", str(folder), "--db", str(w.db)]


# --- labels: one name however its characters are composed; invisible characters refused; listing is read-only


@case("label-zero-width-space-look-alike", "labels", 2, "error", "invisible characters")
def _label_zwsp(w: World) -> Argv:
    return ["label", "r2", "night\u200bly", "--db", str(w.db)]


@case("label-bidi-override", "labels", 2, "error", "invisible characters")
def _label_bidi(w: World) -> Argv:
    return ["label", "r2", "main\u202egnp.exe", "--db", str(w.db)]


@case("label-nfd-finds-the-nfc-label", "labels", 0, "ok", "manifest.json")
def _label_nfd(w: World) -> Argv:
    assert w.cli(["label", "r1", "caf\u00e9", "--db", str(w.db)]).code == 0
    return ["db", "export", "--out", str(w.path("e")), "--run", "cafe\u0301", "--db", str(w.db)]


for _version in (1, 3, 7):

    def _list_older(w: World, version: int = _version) -> Argv:
        return with_db(w, w.db_at_version(version), "label", "--list")

    case(f"label-list-never-migrates-v{_version}", "labels", 2, "error", "moelab db migrate --db")(
        _list_older
    )


# --- signals: a hang-up stops the run like SIGTERM (stop, store what finished, say so) ---------------------


@case(
    "run-stopped-by-SIGHUP",
    "signals",
    128 + signal.SIGHUP,
    "ok",
    "was interrupted",
    store="once",
    once="r-sig",
    via="signal",
    slow=True,
)
def _hangup(w: World) -> Argv:
    w.signal = signal.SIGHUP
    w.ready = w.runs / "r-sig" / "nccl-a2a" / "results.jsonl"
    return ["run", *RUN_ARGS, "--run-id", "r-sig", "--db", str(w.db), "--out", str(w.runs)]


# --- db query: rows fetched are capped (DuckDB streams: the cap bounds memory) ------------------------------


@case("query-30-million-rows-capped", "db", 0, "ok", "range")
def _query_huge(w: World) -> Argv:
    return ["db", "query", "SELECT * FROM range(30000000)", "--db", str(w.db)]


# --- counts: every count a user gives has a stated bound, checked at planning -------------------------------


def _plan(w: World, *extra: str) -> Argv:
    w.absent.append(w.runs / "r-big")
    return ["run", "--cpu", "--run-id", "r-big", *extra, "--db", str(w.db), "--out", str(w.runs)]


for _name, _extra in (
    ("repeat-100-million-dry-run", ["--repeat", "100000000", "--dry-run"]),
    ("repeat-100-million-real", ["--repeat", "100000000"]),
    ("repeat-int64-list-cases", ["--repeat", "9223372036854775807", "--list-cases"]),
    ("iters-10-billion", ["--iters", "10000000000", "--dry-run"]),
    ("timeout-a-year", ["--timeout", "31536000", "--dry-run"]),
):

    def _counted(w: World, extra: list[str] = _extra) -> Argv:
        return _plan(w, *extra)

    case(f"run-{_name}", "plan", 2, "error", "above the largest this moelab plans")(_counted)


@case("suite-repeat-int64", "suite", 2, "error", "repeat must be a whole number from 1 to 1,000")
def _suite_repeat(w: World) -> Argv:
    (w.path("suite.toml")).write_text("repeat = 9223372036854775807\n")
    return _plan(w, "--suite", str(w.path("suite.toml")), "--dry-run")


@case("ingest-spec-repeats-int64", "ingest", 2, "error", "repeats must be from 1 to 1,000")
def _ingest_repeats(w: World) -> Argv:
    w.edit_json(w.new_run / "spec.json", lambda d: d["launch"].update(repeats=9223372036854775807))
    return ["ingest", str(w.new_run), "--db", str(w.db)]
