"""The gate's false alarms and power: on iterations of one process (issue 19), and on synthetic histories
with process-level noise, where the defaults of the processes rule are chosen (issue 29).

1. Iterations (`moelab check` without repeats), per sample count n each side, `--trials` draws of lognormal
   iteration times at a 3% spread: the share the U test calls significant under no change (its level,
   0.2%), the share the gate calls a regression (it also needs a median change past 5%: ~0), a real 2%
   slowdown (significant for the U test at large n, never a regression), a real 7% slowdown (power).

2. Processes (`moelab check` with --repeat N on both runs). A synthetic history: every start of a job
   (a process) gets its own level, lognormal around the op's true time with the CV between processes
   given (1% to 5%; moelab's own 2xH200 history moved stable ops by up to a few %), then 100 iterations
   around that level at a 3% spread with a 5% tail of 1.5x outliers. Baseline and candidate are N starts
   each; the candidate's true time is shifted by 0, +3%, +5% or +10%. Per row `--process-trials` pairs:
   the share flagged as a regression by the defaults (median of the per-process medians past the 5%
   threshold and Student's t-test on their logarithms at p < 0.02) and, on the same draws, by the
   iterations rule on all iterations pooled, which takes one process's iterations as independent samples.
   The targets: no shift flagged at most 1% of the time, +10% caught at least 95% of the time.

    python benchmarks/gate_power.py | tee results/cpu/gate_power.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's moelab

from moelab.gate.decision import Policy, compare_op, compare_processes  # noqa: E402
from moelab.gate.stats import differ  # noqa: E402

SHIFTS = (1.00, 1.03, 1.05, 1.10)
PROCESS_CVS = (0.01, 0.015, 0.02, 0.03, 0.05)
REPEATS = (3, 5)
ITERS = 100
WITHIN = 0.03
FALSE_ALARM_TARGET, POWER_TARGET = 0.01, 0.95


def iteration_table(trials: int, spread: float) -> None:
    policy = Policy()
    print(f"# 1. iterations: {trials} trials per row, lognormal spread {spread}, threshold 5%, p < 0.002")
    print(
        f"{'n per side':>10} {'U sig. (noise)':>15} {'gate FP':>8} {'U sig. (+2%)':>13} {'gate (+2%)':>11} {'power (+7%)':>12} {'s/trial':>8}"
    )
    for n in (5, 10, 100, 1_000, 10_000, 100_000):
        count = trials if n <= 10_000 else max(20, trials // 10)
        rng = np.random.default_rng(n)
        u_noise = gate_fp = u_small = gate_small = caught = 0
        t = time.perf_counter()
        for _ in range(count):
            base = 100 * rng.lognormal(0, spread, n)
            same = 100 * rng.lognormal(0, spread, n)
            small = 102 * rng.lognormal(0, spread, n)
            big = 107 * rng.lognormal(0, spread, n)
            u_noise += bool(differ(base, same).significant)
            gate_fp += compare_op("c", "dispatch", base, same, policy).status == "regression"
            u_small += bool(differ(base, small).significant)
            gate_small += compare_op("c", "dispatch", base, small, policy).status == "regression"
            caught += compare_op("c", "dispatch", base, big, policy).status == "regression"
        per = (time.perf_counter() - t) / count
        print(
            f"{n:>10,} {u_noise / count:>15.2%} {gate_fp / count:>8.2%} {u_small / count:>13.2%} "
            f"{gate_small / count:>11.2%} {caught / count:>12.2%} {per:>8.4f}"
        )


def starts(rng: np.random.Generator, n: int, cv: float, level: float) -> np.ndarray:
    """[process][iteration] times: each process at its own lognormal level, iterations around it."""
    levels = level * rng.lognormal(0.0, cv, (n, 1))
    x = levels * rng.lognormal(0.0, WITHIN, (n, ITERS))
    x[rng.random(x.shape) < 0.05] *= 1.5
    return x


def flagged(rng: np.random.Generator, n: int, cv: float, shift: float, policy: Policy) -> tuple[bool, bool]:
    """(processes rule, iterations rule) call one synthetic baseline/candidate pair a regression."""
    base, cand = starts(rng, n, cv, 100.0), starts(rng, n, cv, 100.0 * shift)
    by_process = compare_processes(
        "c", "op", np.median(base, axis=1), np.median(cand, axis=1), policy, interval=False
    )
    by_iteration = compare_op("c", "op", base.reshape(-1), cand.reshape(-1), policy)
    return by_process.status == "regression", by_iteration.status == "regression"


def process_table(trials: int) -> list[tuple[int, float, list[float]]]:
    policy = Policy()
    print()
    print(
        f"# 2. processes: {trials} baseline/candidate pairs per row; each process {ITERS} iterations at a "
        f"{WITHIN:.0%} spread (5% tail at 1.5x); defaults: threshold {policy.threshold:.0%}, "
        f"t-test on log per-process medians p < {policy.process_alpha}"
    )
    shifts = " ".join(f"{'no shift' if s == 1 else f'+{s - 1:.0%}':>9}" for s in SHIFTS)
    print(f"{'rule':<11} {'starts':>6} {'CV':>5} {shifts}")
    rows = []
    for n in REPEATS:
        for cv in PROCESS_CVS:
            rng = np.random.default_rng(int(1000 * cv) + 17 * n)
            rates = np.zeros((2, len(SHIFTS)))
            for j, shift in enumerate(SHIFTS):
                for _ in range(trials):
                    rates[:, j] += flagged(rng, n, cv, shift, policy)
            rates /= trials
            for name, r in (("processes", rates[0]), ("iterations", rates[1])):
                cells = " ".join(f"{x:>9.2%}" for x in r)
                print(f"{name:<11} {n:>6} {cv:>5.1%} {cells}")
            rows.append((n, cv, list(rates[0])))
    return rows


def verdict(rows: list[tuple[int, float, list[float]]]) -> None:
    worst = max(r[2][0] for r in rows)
    print()
    print(
        f"defaults: false alarms (no shift) at most {worst:.2%} in every row "
        f"({'meets' if worst <= FALSE_ALARM_TARGET else 'MISSES'} the {FALSE_ALARM_TARGET:.0%} target)"
    )
    for n in REPEATS:
        met = [cv for m, cv, r in rows if m == n and r[-1] >= POWER_TARGET]
        upto = f"up to a {max(met):.1%} CV between processes" if met else "at none of these CVs"
        print(f"  +10% caught at least {POWER_TARGET:.0%} of the time with {n} starts a side: {upto}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200, help="draws per row of the iterations table")
    ap.add_argument("--spread", type=float, default=0.03)
    ap.add_argument("--process-trials", type=int, default=3000, help="pairs per row of the processes table")
    args = ap.parse_args()
    iteration_table(args.trials, args.spread)
    verdict(process_table(args.process_trials))


if __name__ == "__main__":
    main()
