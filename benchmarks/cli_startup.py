"""Start-up time of the commands that measure nothing, timed as whole processes (interpreter start,
imports, the command, exit), each repeated; prints the median and the fastest wall time and the CPU
time (user + sys of the child), and which of torch / scipy / matplotlib the command imported.

The CPU time is the figure to read on a shared machine: wall time includes waiting for a core.

    python benchmarks/cli_startup.py --repeat 7 | tee results/cpu/cli_startup.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROBE = """
import json, sys
from moelab.cli.main import app
try:
    app(sys.argv[2:], prog_name="moelab")
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "scipy", "matplotlib"})
open(sys.argv[1], "w").write(json.dumps(heavy))
"""


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, child CPU s) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    import duckdb

    from tests.synthetic_history import HistoryModel, build

    tmp = Path(tempfile.mkdtemp(prefix="moelab-startup-"))
    db = tmp / "h.duckdb"
    con = duckdb.connect(str(db))
    build(con, HistoryModel(runs=100, samples_per_run=1_000))
    con.close()
    d = ["--db", str(db)]
    commands = [
        ["--help"], ["runs", *d], ["report", "--help"], ["compare", "--help"], ["check", "--help"],
        ["label", "--list", *d], ["db", "--help"], ["doctor", "--help"], ["trace", "--help"],
        ["run", "--help"],
    ]  # fmt: skip
    print(f"# moelab CLI start-up, whole processes, {args.repeat} runs each; {platform.node()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; python {platform.python_version()}")  # fmt: skip
    print("# baseline: `python -c pass` and `python -c 'import typer, duckdb'` show the floor")
    print(f"{'command':<28} {'wall median s':>13} {'wall min s':>10} {'cpu median s':>12}  imports")
    floor = [[sys.executable, "-c", "pass"], [sys.executable, "-c", "import typer, duckdb, rich.table"]]
    for name, argv in (("python -c pass", floor[0]), ("import typer, duckdb, rich", floor[1])):
        samples = [timed(argv) for _ in range(args.repeat)]
        walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
        print(
            f"{name:<28} {statistics.median(walls):>13.3f} {min(walls):>10.3f} {statistics.median(cpus):>12.3f}"
        )
    for cmd in commands:
        argv = [sys.executable, "-m", "moelab.cli.main", *cmd]
        samples = [timed(argv) for _ in range(args.repeat)]
        walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
        probe = tmp / "probe.json"
        subprocess.run(
            [sys.executable, "-c", PROBE, str(probe), *cmd], cwd=ROOT, capture_output=True, check=False
        )
        heavy = json.loads(probe.read_text()) if probe.exists() else ["?"]
        label = "moelab " + " ".join(c for c in cmd if not c.startswith(str(tmp)) and c != "--db")
        print(f"{label:<28} {statistics.median(walls):>13.3f} {min(walls):>10.3f} {statistics.median(cpus):>12.3f}  "
              f"{', '.join(heavy) or 'none of torch/scipy/matplotlib'}")  # fmt: skip


if __name__ == "__main__":
    main()
