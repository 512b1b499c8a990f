"""Planning time of large suites, timed as whole `moelab run --cpu --dry-run` processes (interpreter start,
imports, suite expansion, every case's checks, the printed plan), each repeated; prints the median and
fastest wall time and the child's CPU time (user + sys: the figure to read on a shared machine).

    python benchmarks/plan_scale.py --repeat 3 | tee results/cpu/plan_scale.txt
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1_000, 10_000, 100_000)


def suite_text(cases: int) -> str:
    """A suite of exactly `cases` cases: seeds x hidden sizes x SM counts."""
    hidden = [128, 256, 512, 1024, 2048, 4096, 7168, 8192, 1536, 3072]
    sms = ["default", 8, 16, 24, 32, 40, 48, 56, 64, 72]
    seeds = cases // (len(hidden) * len(sms))
    assert seeds * len(hidden) * len(sms) == cases
    return (
        f'name = "scale{cases}"\n[workload]\nexperts_per_rank = 8\ntokens_per_rank = 64\n[axes]\n'
        f"hidden = {hidden}\nseed = {list(range(seeds))}\nsms = {sms}\n".replace("'", '"')
    )


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="moelab-plan-scale-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(tmp / "data"))
    print(
        f"moelab run --cpu --dry-run over suites of N cases; {a.repeat} runs each; python {sys.version.split()[0]}"
    )
    print(f"{'cases':>8} {'wall median s':>14} {'wall min s':>11} {'cpu median s':>13} {'exit':>5}")
    for n in SIZES:
        path = tmp / f"s{n}.toml"
        path.write_text(suite_text(n))
        argv = [sys.executable, "-m", "moelab.cli.main", "run", "--cpu", "--dry-run", "--suite", str(path)]
        runs = [timed(argv, env) for _ in range(a.repeat)]
        walls, cpus, codes = zip(*runs, strict=True)
        row = (
            f"{n:>8,} {statistics.median(walls):>14.2f} {min(walls):>11.2f} {statistics.median(cpus):>13.2f}"
        )
        print(f"{row} {max(codes):>5}")
    over = tmp / "over.toml"
    over.write_text(
        suite_text(100_000).replace("name =", "# more than the limit\nname =") + "topk = [2, 4]\n"
    )
    argv = [sys.executable, "-m", "moelab.cli.main", "run", "--cpu", "--dry-run", "--suite", str(over)]
    wall, _, code = timed(argv, env)
    print(f"{200_000:>8,} refused in {wall:.2f} s with exit {code} (the case-count limit)")


if __name__ == "__main__":
    main()
