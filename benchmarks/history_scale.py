"""History at scale (issue 19): synthetic stores of 100, 1,000 and 10,000 runs, built with bulk SQL
(tests/synthetic_history.py), and the figures of the issue's table measured on them:

- start-up of `moelab --help` and `moelab runs` (whole processes);
- `moelab report --history` over every run: time and file size;
- `moelab compare --by run` and `--by nccl` over every run;
- ingest of one run directory holding 1M samples (the real ingest, in process), and of a small run into
  a store that already holds the history;
- `moelab check` against an export baseline of 10,000 samples per op, and at 515 + 515 samples
  (where the old gate crashed).

Whole-process figures give the median wall time over --repeat runs and the CPU time (user + sys) of
the child (in-process figures: the process's CPU time, DuckDB's threads included): on a shared machine
the wall time includes waiting for a core, the CPU time does not.

    python benchmarks/history_scale.py | tee results/cpu/history_scale.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402

from moelab.store.db import connect  # noqa: E402
from moelab.store.export import export_runs  # noqa: E402
from moelab.store.ingest import ingest  # noqa: E402
from tests.synthetic_history import HistoryModel, build  # noqa: E402
from tests.synthetic_runs import RunModel, write_run  # noqa: E402

STEPS = {("deepep", "dispatch"): [(0.6, 1.08)], ("nccl-a2a", "combine"): [(0.3, 0.92)]}


def cli(args: list[str], repeat: int) -> tuple[float, float, int]:
    """(median wall s, median CPU s, exit code) of `moelab ARGS` as whole processes."""
    walls, cpus, code = [], [], 0
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "moelab.cli.main", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        code = proc.returncode
        if code not in (0, 1):
            raise SystemExit(f"moelab {' '.join(args)} failed ({code}): {proc.stderr.strip()[-500:]}")
    return statistics.median(walls), statistics.median(cpus), code


def row(what: str, wall: float, cpu: float | None = None, extra: str = "") -> None:
    cpu_text = f"{cpu:8.2f}" if cpu is not None else f"{'—':>8}"
    print(f"  {what:<46} {wall:8.2f} {cpu_text}  {extra}", flush=True)


def history_case(tmp: Path, runs: int, samples_per_run: int, repeat: int) -> None:
    db = tmp / f"h{runs}.duckdb"
    steps = {k: [(int(at * runs), f) for at, f in v] for k, v in STEPS.items()}
    t = time.perf_counter()
    con = duckdb.connect(str(db))
    build(
        con,
        HistoryModel(runs=runs, samples_per_run=samples_per_run, steps=steps, label_every=max(1, runs // 4)),
    )
    n_samples = con.execute("SELECT count(*) FROM samples").fetchone()[0]  # type: ignore[index]
    n_results = con.execute("SELECT count(*) FROM results").fetchone()[0]  # type: ignore[index]
    con.close()
    built = time.perf_counter() - t
    print(
        f"\n{runs:,} runs, {n_results:,} results, {n_samples:,} samples ({samples_per_run:,} per run); "
        f"built in {built:.1f} s, {db.stat().st_size / 1e6:.0f} MB",
        flush=True,
    )
    print(f"  {'what':<46} {'wall s':>8} {'cpu s':>8}")
    d = ["--db", str(db)]
    wall, cpu, _ = cli(["--help"], repeat)
    row("moelab --help", wall, cpu)
    wall, cpu, _ = cli(["runs", *d], repeat)
    row("moelab runs", wall, cpu)
    out = tmp / f"history{runs}.html"
    wall, cpu, _ = cli(["report", "--history", *d, "-o", str(out)], repeat)
    html = out.read_text()
    row("moelab report --history (every run)", wall, cpu,
        f"{out.stat().st_size / 1e6:.2f} MB, {html.count('<svg')} charts, {html.count('</tr>') - 1} table rows")  # fmt: skip
    wall, cpu, _ = cli(["compare", "--by", "run", *d], repeat)
    row("moelab compare --by run (every run, paged)", wall, cpu)
    wall, cpu, _ = cli(["compare", "--by", "nccl", *d], repeat)
    row("moelab compare --by nccl (every run)", wall, cpu)
    small = write_run(tmp / "runs", RunModel(run_id=f"small-{runs}", created_at="2027-06-01T00:00:00+00:00"))
    con = connect(db)
    t, c = time.perf_counter(), time.process_time()
    ingest(con, small)
    row(
        "ingest of one small run into this store",
        time.perf_counter() - t,
        time.process_time() - c,
        "in process",
    )
    con.close()
    shutil.rmtree(small)
    db.unlink()


def ingest_case(tmp: Path) -> None:
    # 8 ranks x (2 ops x 62,500 iterations + 5 pair repetitions) = 1,000,040 samples in one case
    model = RunModel(run_id="big", world=8, iters=62_500, tokens=(512,), noise=0.02)
    run_dir = write_run(tmp / "runs", model)
    db = tmp / "ingest.duckdb"
    con = connect(db)
    t, c = time.perf_counter(), time.process_time()
    ingest(con, run_dir)
    took, cpu = time.perf_counter() - t, time.process_time() - c
    n = con.execute("SELECT count(*) FROM samples").fetchone()[0]  # type: ignore[index]
    con.close()
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    print(f"\ningest of one run directory ({size / 1e6:.0f} MB of files)")
    print(f"  {'what':<46} {'wall s':>8} {'cpu s':>8}")
    row(
        f"ingest, {n:,} samples (read, summarise, store)",
        took,
        cpu,
        "in process (cpu: all its threads), one try",
    )
    shutil.rmtree(run_dir)
    db.unlink()


def check_case(tmp: Path, repeat: int) -> None:
    print("\nmoelab check against an export baseline")
    print(f"  {'what':<46} {'wall s':>8} {'cpu s':>8}")
    for per_op in (515, 10_000):
        db = tmp / f"check{per_op}.duckdb"
        con = duckdb.connect(str(db))
        # 12 results per run, 2 ranks: per_op iterations per op on each side
        build(
            con,
            HistoryModel(runs=2, samples_per_run=12 * 2 * per_op, steps={("deepep", "dispatch"): [(1, 1.1)]}),
        )
        export = tmp / f"baseline{per_op}"
        export_runs(con, export, "parquet", ["r000000"])
        con.close()
        # the synthetic history changes the driver at its middle run: the check is allowed across it
        argv = ["check", "--baseline", str(export), "--run", "r000001", "--allow-different-hardware"]
        wall, cpu, code = cli([*argv, "--db", str(db)], repeat)
        row(
            f"moelab check, {per_op:,} samples per op a side",
            wall,
            cpu,
            f"exit {code} (1: the 10% step is a regression)",
        )
        shutil.rmtree(export)
        db.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--sizes", default="100:100000,1000:10000,10000:1000",
        help="runs:samples-per-run pairs (default: 1e7 samples in each store)",
    )  # fmt: skip
    args = ap.parse_args()
    print(f"# moelab history at scale; {platform.node()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at start; python {platform.python_version()}, duckdb {duckdb.__version__}")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="moelab-history-"))
    try:
        for spec in args.sizes.split(","):
            runs, per_run = (int(x) for x in spec.split(":"))
            history_case(tmp, runs, per_run, args.repeat)
        ingest_case(tmp)
        check_case(tmp, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
