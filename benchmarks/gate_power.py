"""The gate's false-positive rate and power from small to large sample counts (issue 19: the gate must
not crash, nor turn oversensitive, at large n).

Per sample count n (each side), `--trials` draws of lognormal iteration times at a 3% spread:
- noise: both sides from one distribution; the share the U test calls significant (its level: 0.2%) and
  the share the gate calls a regression (it also needs a median change past 5%: ~0);
- a real 2% slowdown: significant for the U test at large n, yet never a regression (under the threshold);
- a real 7% slowdown: the share caught (power).

    python benchmarks/gate_power.py | tee results/cpu/gate_power.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's moelab

from moelab.gate.decision import Policy, compare_op  # noqa: E402
from moelab.gate.stats import differ  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--spread", type=float, default=0.03)
    args = ap.parse_args()
    policy = Policy()
    print(f"# {args.trials} trials per row, lognormal spread {args.spread}, threshold 5%, p < 0.002")
    print(
        f"{'n per side':>10} {'U sig. (noise)':>15} {'gate FP':>8} {'U sig. (+2%)':>13} {'gate (+2%)':>11} {'power (+7%)':>12} {'s/trial':>8}"
    )
    for n in (5, 10, 100, 1_000, 10_000, 100_000):
        trials = args.trials if n <= 10_000 else max(20, args.trials // 10)
        rng = np.random.default_rng(n)
        u_noise = gate_fp = u_small = gate_small = caught = 0
        t = time.perf_counter()
        for _ in range(trials):
            base = 100 * rng.lognormal(0, args.spread, n)
            same = 100 * rng.lognormal(0, args.spread, n)
            small = 102 * rng.lognormal(0, args.spread, n)
            big = 107 * rng.lognormal(0, args.spread, n)
            u_noise += bool(differ(base, same).significant)
            gate_fp += compare_op("c", "dispatch", base, same, policy).status == "regression"
            u_small += bool(differ(base, small).significant)
            gate_small += compare_op("c", "dispatch", base, small, policy).status == "regression"
            caught += compare_op("c", "dispatch", base, big, policy).status == "regression"
        per = (time.perf_counter() - t) / trials
        print(f"{n:>10,} {u_noise / trials:>15.2%} {gate_fp / trials:>8.2%} {u_small / trials:>13.2%} "
              f"{gate_small / trials:>11.2%} {caught / trials:>12.2%} {per:>8.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
