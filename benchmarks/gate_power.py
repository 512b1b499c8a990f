"""The gate's false alarms and power per op class (issue 38), from the decision `moelab check` makes
(moelab.gate.noise.classify, through the vectorized trials of moelab.gate.power).

Each row: `--trials` synthetic checks of one op class at one between-process CV and one --repeat count,
with the noise learned from a history of `--history` earlier runs (the gate's usual case once a store has
runs) or, with none, the class's prior. Columns: the share called a regression with no shift (a false
alarm; the target is at most 1%, at every repeat count), and the share caught at +5%, +10% and +20%. The
share the gate said it could not judge ("cannot judge ... use --repeat N", never a pass) is given beside
each: that is where the op's noise hides a change of the threshold's size.

    python benchmarks/gate_power.py | tee results/cpu/gate_power.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's moelab

from moelab.gate.noise import ALPHA, POWER, PRIOR_CV  # noqa: E402
from moelab.gate.power import rates, trials  # noqa: E402

CLASSES = (("kernel-bound", "combine", 0.002), ("host-sync", "roundtrip", 0.10))
REPEATS = (1, 3, 5)
SHIFTS = (0.0, 0.05, 0.10, 0.20)


def _cell(share: float, cannot: float) -> str:
    return f"{100 * share:6.2f}% ({100 * cannot:5.1f}%)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5000)
    ap.add_argument("--history", type=int, default=20)
    ap.add_argument("--threshold", type=float, default=0.05)
    args = ap.parse_args()
    start = time.perf_counter()
    print(
        f"# {args.trials} trials per row; threshold {args.threshold:.0%}; one-sided alpha {ALPHA}, power "
        f"{POWER:.0%} at the threshold; priors (no history): "
        + ", ".join(f"{k} CV {100 * v:g}%" for k, v in PRIOR_CV.items())
    )
    print("# each cell: called a regression (in brackets: 'cannot judge', never a pass)")
    head = f"{'op class':13} {'CV':>5} {'history':>8} {'repeat':>6}"
    print(head + "".join(f"{'no shift' if s == 0 else f'+{s:.0%}':>20}" for s in SHIFTS))
    worst = 0.0
    for klass, op, cv in CLASSES:
        for history in (args.history, 0):
            for repeats in REPEATS:
                cells = []
                for k, shift in enumerate(SHIFTS):
                    r = rates(trials(op, cv, repeats, shift, args.trials, history, args.threshold, seed=k))
                    if shift == 0:
                        worst = max(worst, r.regression)
                    cells.append(f"{_cell(r.regression, r.underpowered):>20}")
                print(f"{klass:13} {100 * cv:4.1f}% {history:>8} {repeats:>6}" + "".join(cells))
    print(f"\nfalse alarms at most {100 * worst:.2f}% in every row (target: 1%)")
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
