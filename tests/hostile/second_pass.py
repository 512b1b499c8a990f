"""The hostile-input table's second pass (issue 41): rows on exports, labels, bounds, plugins, the model, the
gate and signals that the first pass did not reach. Importing this module adds its rows to `CASES`."""

from __future__ import annotations

import json
import os
import signal

from tests.hostile.cases import RUN_ARGS, Argv, case, with_db
from tests.hostile.world import REPO, World

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
    w.outputs.append(out)
    return ["db", "export", "--out", str(out), "--force", "--db", str(w.db)]


@case("export-carries-the-labels", "export", 0, "ok", "labels.parquet")
def _export_labels(w: World) -> Argv:
    w.outputs.append(w.path("e"))
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
    w.outputs.append(w.path("e"))
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
    via="during",
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


# --- plugins: names checked like labels, code run under a time limit, its exits reported -------------------


def plugin(w: World, body: str, name: str = "broken") -> None:
    """A plugin registered as `name` under the entry-point group, whose module runs `body` when imported."""
    root = w.path("plugins")
    dist = root / "broken_plugin-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[moelab.backends]\n{name} = broken_plugin:Broken\n")
    (root / "broken_plugin.py").write_text(body)
    w.env = {"PYTHONPATH": f"{root}{os.pathsep}{REPO}"}


A_BACKEND = "from moelab.backends.nccl_a2a import NcclA2ABackend as Broken\n"
HANGING_AVAILABILITY = """import time
from moelab.backends.nccl_a2a import NcclA2ABackend


class Broken(NcclA2ABackend):
    @classmethod
    def availability(cls):
        time.sleep(3600)
"""


def _run_plugin(w: World, name: str = "broken", *extra: str) -> Argv:
    w.absent.append(w.runs / "r-plugin")
    return [
        "run",
        "--cpu",
        "--backend",
        name,
        "--run-id",
        "r-plugin",
        *extra,
        "--db",
        str(w.db),
        "--out",
        str(w.runs),
    ]


for _name, _body, _says in (
    ("sys-exit-3", "import sys\nsys.exit(3)\n", "SystemExit: 3"),
    ("keyboard-interrupt", "raise KeyboardInterrupt\n", "KeyboardInterrupt"),
):

    def _exits_listing(w: World, body: str = _body) -> Argv:
        plugin(w, body)
        return ["backends"]

    def _exits_run(w: World, body: str = _body) -> Argv:
        plugin(w, body)
        return _run_plugin(w, "broken", "--dry-run")

    case(f"plugin-import-{_name}-listing", "plugins", 0, "ok", _says, via="proc")(_exits_listing)
    case(f"plugin-import-{_name}-run", "plugins", 2, "error", _says, via="proc")(_exits_run)


@case("plugin-import-hangs-listing", "plugins", 0, "ok", "did not finish in 15 s", via="proc", slow=True)
def _import_hangs(w: World) -> Argv:
    plugin(w, "import time\ntime.sleep(3600)\n")
    return ["backends"]


@case(
    "plugin-availability-hangs-run",
    "plugins",
    2,
    "error",
    "availability() did not finish",
    via="proc",
    slow=True,
)
def _availability_hangs(w: World) -> Argv:
    plugin(w, HANGING_AVAILABILITY)
    return _run_plugin(w)


@case("plugin-name-is-a-path", "plugins", 2, "error", "is not a plain name", via="proc")
def _name_path(w: World) -> Argv:
    escaped = w.path("escaped")
    name = "../../../../../.." + str(escaped)
    plugin(w, A_BACKEND, name)
    w.absent.append(escaped)
    return _run_plugin(w, name)


@case("plugin-name-holds-esc-and-osc-run", "plugins", 2, "error", "is not a plain name", via="proc")
def _name_esc_run(w: World) -> Argv:
    name = "evil\x1b[31mred\x1b]0;pwn\x07"
    plugin(w, A_BACKEND, name)
    return _run_plugin(w, name)


@case("plugin-name-holds-esc-and-osc-listing", "plugins", 0, "ok", "evil\\x1b[31mred", via="proc")
def _name_esc_listing(w: World) -> Argv:
    plugin(w, A_BACKEND, "evil\x1b[31mred\x1b]0;pwn\x07")
    return ["backends"]


# --- model: counts at least 1, finite figures, a bounded size, strict JSON ----------------------------------

for _name, _args, _says in (
    ("nodes-0", ["--nodes", "0"], "--nodes must be at least 1"),
    ("experts-per-rank-0", ["--experts-per-rank", "0"], "--experts-per-rank must be at least 1"),
    ("nvlink-gbps-inf", ["--nvlink-gbps", "inf"], "must be a finite number"),
    ("latency-nan", ["--latency-us", "nan"], "must be a finite number"),
    ("latency-inf-json", ["--latency-us", "inf", "--json"], "must be a finite number"),
    ("zipf-512-nodes", ["--routing", "zipf", "--nodes", "512", "--gpus-per-node", "8"], "is above the"),
    ("world-a-million", ["--nodes", "1000000"], "above the largest modelled"),
):

    def _model(w: World, args: list[str] = _args) -> Argv:
        return ["model", *args]

    case(f"model-{_name}", "model", 2, "error", _says)(_model)


@case("model-peaks-gbps-inf", "model", 2, "error", "positive finite number")
def _peaks_inf(w: World) -> Argv:
    w.path("peaks.toml").write_text('[gpu."H100"]\ngbps = inf\n')
    return ["model", "--peaks", str(w.path("peaks.toml"))]


# --- outputs written after measuring are checked before it ---------------------------------------------------


@case("run-report-path-unwritable", "report", 2, "error", "--report /proc/no/r.html cannot be written")
def _report_unwritable(w: World) -> Argv:
    return _plan(w, "--report", "/proc/no/r.html")


@case("tune-suite-out-unwritable", "report", 2, "error", "--suite-out /proc/s.toml cannot be written")
def _suite_out_unwritable(w: World) -> Argv:
    w.absent.append(w.path("tune-runs"))
    return [
        "tune",
        "--cpu",
        "--suite-out",
        "/proc/s.toml",
        "--db",
        str(w.db),
        "--out",
        str(w.path("tune-runs")),
    ]


@case("run-report-is-a-folder", "report", 2, "error", "is a folder")
def _report_folder(w: World) -> Argv:
    w.path("rep").mkdir()
    return _plan(w, "--report", str(w.path("rep")))


# --- suite files are checked whole, whatever a flag replaces -----------------------------------------------

for _name, _text, _flag in (
    ("workload-experts-per-rank-1.5", "[workload]\nexperts_per_rank = 1.5\n", ["--experts-per-rank", "4"]),
    ("axis-hidden-string", '[axes]\nhidden = [1024, "big"]\n', ["--hidden", "256"]),
    ("backend-workload-topk-0", "[backend.nccl-a2a.workload]\ntopk = 0\n", ["--topk", "2"]),
):

    def _hidden_by_flag(w: World, text: str = _text, flag: list[str] = _flag) -> Argv:
        w.path("suite.toml").write_text(text)
        return _plan(w, "--suite", str(w.path("suite.toml")), *flag, "--dry-run")

    case(f"suite-{_name}-replaced-by-a-flag", "suite", 2, "error", "suite.toml: [")(_hidden_by_flag)


# --- compare reads samples as the gate does ---------------------------------------------------------------


@case("compare-all-zero-samples-not-ranked", "report", 0, "ok", "not ranked: times not above zero")
def _compare_zeros(w: World) -> Argv:
    import duckdb

    con = duckdb.connect(str(w.db))
    con.execute("UPDATE samples SET time_us = 0 WHERE run_id = 'r2'")
    con.execute("UPDATE results SET median_us = 0 WHERE run_id = 'r2'")
    con.close()
    return ["compare", "--run", "r1", "--run", "r2", "--by", "run", "--db", str(w.db)]


# --- a fake nsys whose --version hangs: one line, and its children reaped ------------------------------------


@case("nsys-version-hangs-children-reaped", "plugins", 2, "error", "--version failed", via="proc", slow=True)
def _nsys_hangs(w: World) -> Argv:
    import sys

    bin_dir = w.path("fakebin")
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    # sh forks the sleeper as its own child; its command line names the case's folder (the harness's check)
    fake.write_text(f"#!/bin/sh\n{sys.executable} -c 'import time; time.sleep(600)' {w.root}\n")
    fake.chmod(0o755)
    w.env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return _plan(w, "--trace", "nsys")


# --- ragged samples: stored, marked suspect, and said ------------------------------------------------------


def make_ragged(w: World) -> None:
    """Rank 1 of the first case holds one sample of its first op, the other rank all of them."""
    first, *rest = w.results_lines()
    record = json.loads(first)
    record["ops"][0]["samples_us"][1] = record["ops"][0]["samples_us"][1][:1]
    w.write_results(b"\n".join([json.dumps(record).encode(), *rest]) + b"\n")


# --- ulimit -n 12: a cause, not a job timed out with none ------------------------------------------------


def _twelve_files() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))


@case("run-under-ulimit-n-12", "plan", 2, "error", "the open-file limit is 12", via="proc")
def _ulimit(w: World) -> Argv:
    w.preexec = _twelve_files
    return _plan(w)
