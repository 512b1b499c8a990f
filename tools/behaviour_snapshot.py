"""Capture what moelab shows a user, so a refactoring can be shown to change none of it.

Writes one text file per probe into OUT_DIR: every command's --help, the dry-run plans of `moelab run` and
`moelab verify` over launchers, suites and traces, the `error:` line and exit code of a list of bad inputs,
and the rows a short CPU run stores (DuckDB tables, with run ids, timestamps, host names, paths and
measured figures replaced by placeholders, so only what the code decides stays). Run it before and after
a change and diff the two folders:

    python tools/behaviour_snapshot.py /tmp/before && <change> && python tools/behaviour_snapshot.py /tmp/after
    diff -r /tmp/before /tmp/after
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

RUN_ID = "snap-run"

HELP = [
    [],
    ["run"],
    ["verify"],
    ["tune"],
    ["backends"],
    ["runs"],
    ["report"],
    ["compare"],
    ["check"],
    ["label"],
    ["ingest"],
    ["doctor"],
    ["db"],
    ["db", "query"],
    ["db", "export"],
    ["trace"],
    ["trace", "summarize"],
]

DRY_RUNS: dict[str, list[str]] = {
    "run_local": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID],
    "run_local_two_backends": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "-b", "nccl-a2a,mxfp8-a2a"],
    "run_torchrun_2node": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "--launcher", "torchrun", "--nodes", "2",
                           "--gpus-per-node", "2", "--rdzv-endpoint", "host0:29500"],
    "run_slurm_2node": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "--launcher", "slurm", "--nodes", "2",
                        "--gpus-per-node", "4"],
    "run_mpirun_2node": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "--launcher", "mpirun", "--nodes", "2",
                         "--gpus-per-node", "4"],
    "run_sbatch": ["run", "--cpu", "--dry-run", "--sbatch", "--run-id", RUN_ID, "--nodes", "2", "--gpus-per-node", "8",
                   "--partition", "p", "--account", "a"],
    "run_nsys": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "--trace", "nsys"],
    "run_wrap": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "--wrap", "ncu -o {out}"],
    "run_e2e_dry": ["run", "--cpu", "--dry-run", "--run-id", RUN_ID, "--suite", "e2e", "-b", "nccl-a2a"],
    "list_dispatch": ["run", "--cpu", "--list-cases", "-b", "nccl-a2a,mxfp8-a2a,deepep,hybrid-ep"],
    "list_e2e": ["run", "--cpu", "--list-cases", "--suite", "e2e", "-b", "nccl-a2a,mxfp8-a2a,deepep,hybrid-ep"],
    "list_routings": ["run", "--cpu", "--list-cases", "--suite", "routings", "-b", "nccl-a2a"],
    "list_tokens": ["run", "--cpu", "--list-cases", "--suite", "tokens", "-b", "nccl-a2a,torch-symm-a2a"],
    "list_gpus8": ["run", "--cpu", "--list-cases", "--gpus", "8", "-b", "nccl-a2a,deepep-ll,nccl-ep,uccl-ep"],
    "verify_dry": ["verify", "--cpu", "--dry-run", "-b", "deepep,hybrid-ep,nccl-tests,deepep-ll",
                   "--backend-path", "deepep={tree}", "--backend-path", "hybrid-ep={tree}", "--hidden", "7168"],
    "verify_dry_sms": ["verify", "--cpu", "--dry-run", "-b", "hybrid-ep,nccl-tests", "--backend-path",
                       "hybrid-ep={tree}", "--sms", "16", "--dtype", "bf16"],
}  # fmt: skip

BAD_INPUTS: dict[str, list[str]] = {
    "unknown_backend": ["run", "--cpu", "-b", "nope"],
    "backend_twice": ["run", "--cpu", "-b", "nccl-a2a,nccl-a2a"],
    "bad_hidden": ["run", "--cpu", "--hidden", "x"],
    "bad_iters": ["run", "--cpu", "--iters", "0"],
    "bad_noise": ["run", "--cpu", "--noise-target", "2"],
    "bad_launcher": ["run", "--cpu", "--launcher", "nope"],
    "bad_trace": ["run", "--cpu", "--trace", "perf"],
    "bad_bind": ["run", "--cpu", "--bind", "core"],
    "nodes_local": ["run", "--cpu", "--nodes", "2", "--launcher", "local"],
    "bad_run_id": ["run", "--cpu", "--run-id", "a/b"],
    "bad_label": ["run", "--cpu", "--label", "a\x01b"],
    "bad_case": ["run", "--cpu", "--case", "nope"],
    "bad_suite_file": ["run", "--cpu", "--suite", "/nonexistent.toml"],
    "bad_suite_name": ["run", "--cpu", "--suite", "nope"],
    "bad_backend_path": ["run", "--cpu", "--backend-path", "deepep"],
    "bad_kernel_cache": ["run", "--cpu", "--kernel-cache", "/etc/hostname"],
    "bad_knob_suite": ["run", "--cpu", "--suite", "{bad_knob_suite}"],
    "bad_e2e_knob_suite": ["run", "--cpu", "--suite", "{bad_e2e_suite}"],
    "unknown_option": ["run", "--nope"],
    "verify_bad_backend": ["verify", "--cpu", "--dry-run", "-b", "nccl-a2a"],
    "verify_bad_tol": ["verify", "--cpu", "--dry-run", "-b", "nccl-tests", "--tolerance", "2"],
    "verify_two_hidden": ["verify", "--cpu", "--dry-run", "-b", "nccl-tests", "--hidden", "1,2"],
    "tune_bad_backend": ["tune", "--cpu", "--backend", "nope"],
    "tune_bad_sms": ["tune", "--cpu", "--backend", "nccl-a2a", "--sms", "0"],
    "tune_bad_preset": ["tune", "--cpu", "--preset", "nope"],
    "check_no_baseline": ["check", "--baseline", "nope"],
    "report_no_run": ["report", "--run", "nope", "-o", "{tmp}/r.html"],
    "label_no_run": ["label", "nope", "x"],
    "ingest_missing": ["ingest", "/nonexistent-run-dir"],
    "db_query_write": ["db", "query", "DELETE FROM runs"],
    "trace_missing": ["trace", "summarize", "/nonexistent.json"],
}  # fmt: skip

CPU_RUNS: dict[str, list[str]] = {
    "a2a": ["run", "--cpu", "--run-id", RUN_ID, "-b", "nccl-a2a,mxfp8-a2a", "--sms", "default", "--iters", "3",
            "--warmup", "1", "--hidden", "256", "--tokens-per-rank", "64", "--experts-per-rank", "4",
            "--no-health", "--quiet"],
    "e2e": ["run", "--cpu", "--run-id", RUN_ID + "-e2e", "-b", "nccl-a2a", "--suite", "e2e", "--sms", "default",
            "--iters", "2", "--warmup", "1", "--hidden", "128", "--tokens-per-rank", "32", "--experts-per-rank", "4",
            "--no-health", "--quiet"],
}  # fmt: skip

# a placeholder for what differs between two runs of the same code: ids, times, hosts, paths, figures
VOLATILE = [
    (re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}"), "<run-id>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(\+\d{2}:\d{2})?"), "<time>"),
    (re.compile(r"/tmp/[^\s\"',)\]]+"), "<tmp-path>"),
    (re.compile(r"pid \d+"), "pid <n>"),
]
FIGURE_COLUMNS = re.compile(
    r"(_us|_s|_ms|gbps|_at|pid|value|samples|noise|spread|iqr|p\d+|median|mean|stdev|cv|duration|^host$|size_bytes"
    r"|err|one_time|elapsed|load|raw|env_vars|tails|argv|stderr|log|timestamp|created|started|finished|command"
    r"|python|torch|git_sha|moelab_version|path|counters|before|after|snapshot|rank_spread|unstable|suspect|stability)",
)


def scrub(text: str) -> str:
    for pattern, placeholder in VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def moelab(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "moelab.cli.main", *args], capture_output=True, text=True, env=env, cwd=cwd,
        timeout=900,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def dump_db(db: Path) -> str:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    out = []
    tables = [
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()
    ]
    for table in tables:
        cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
        keep = [c for c in cols if c != "run_id" and not FIGURE_COLUMNS.search(c)]
        out.append(f"## {table}: columns {cols}")
        if table == "samples":
            count = con.execute(
                "SELECT backend, case_id, op, count(*) FROM samples GROUP BY ALL ORDER BY ALL"
            )
            out += [repr(r) for r in count.fetchall()]
            continue
        if not keep:
            out.append(f"rows: {con.execute(f'SELECT count(*) FROM {table}').fetchone()[0]}")  # type: ignore[index]
            continue
        rows = con.execute(f"SELECT {', '.join(keep)} FROM {table}").fetchall()
        out += sorted(scrub(repr(r)) for r in rows)
    con.close()
    return "\n".join(out) + "\n"


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="moelab-snap-"))
    tree = tmp / "tree"
    (tree / "tests").mkdir(parents=True)
    bad_knob = tmp / "bad_knob.toml"
    bad_knob.write_text(
        'name = "x"\n[workload]\nhidden = 256\nexperts_per_rank = 8\n[backend.nccl-a2a.axes]\nnope = [1]\n'
    )
    bad_e2e = tmp / "bad_e2e.toml"
    bad_e2e.write_text(
        'name = "x"\n[workload]\nhidden = 256\nexperts_per_rank = 8\n[backend.nccl-a2a.axes]\nbench = ["e2e"]\nmode = ["x"]\n'
    )
    env = dict(os.environ, COLUMNS="120", MOELAB_DB=str(tmp / "run_a2a.duckdb"), NO_COLOR="1", TERM="dumb")
    env["XDG_DATA_HOME"] = str(tmp / "data")
    fill = {
        "tree": str(tree),
        "tmp": str(tmp),
        "bad_knob_suite": str(bad_knob),
        "bad_e2e_suite": str(bad_e2e),
    }

    def expand(args: list[str]) -> list[str]:
        return [a.format(**fill) if "{" in a and "}" in a and not a.startswith("ncu") else a for a in args]

    for name, args in CPU_RUNS.items():
        db = tmp / f"run_{name}.duckdb"
        code, stdout, stderr = moelab([*args, "--db", str(db), "--out", str(tmp / "runs")], env, tmp)
        (out_dir / f"cpu_{name}_exit.txt").write_text(f"exit {code}\n")
        (out_dir / f"cpu_{name}_rows.txt").write_text(dump_db(db) if db.exists() else stderr)
    for args in HELP:
        code, stdout, stderr = moelab([*args, "--help"], env, tmp)
        (out_dir / f"help_{'_'.join(args) or 'moelab'}.txt").write_text(f"exit {code}\n{stdout}{stderr}")
    for name, args in DRY_RUNS.items():
        code, stdout, stderr = moelab(expand(args), env, tmp)
        (out_dir / f"dry_{name}.txt").write_text(scrub(f"exit {code}\n{stdout}{stderr}"))
    for name, args in BAD_INPUTS.items():
        code, stdout, stderr = moelab(expand(args), env, tmp)
        (out_dir / f"bad_{name}.txt").write_text(scrub(f"exit {code}\n{stdout}{stderr}"))
    (out_dir / "probes.json").write_text(
        json.dumps({"help": len(HELP), "dry": len(DRY_RUNS), "bad": len(BAD_INPUTS), "cpu": len(CPU_RUNS)})
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
