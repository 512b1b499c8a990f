"""What a `moelab run --repeat N` stored, per op and between its backends: the figures issue 29 asks for.

Per (backend, case, op): the processes that measured it, the median of their medians with its 95%
bootstrap interval and the CV between them, each start's own median and noise (within the process); the
chained `pair` op's period where the backend has one, beside `roundtrip`. Between the run's backends (the
first as the reference): each ratio of times with its interval, paired by start, and the verdict
`moelab compare` gives (faster, slower, indistinguishable, or not ranked when the slowest and the fastest
rank disagree). Reads the store only, so it runs anywhere (a CPU run: small sizes).

    moelab run --repeat 3 --label rep3 ...
    python benchmarks/repeat_intervals.py --run rep3 --json results/<dir>/intervals.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's moelab

from moelab.model.links import PeakTable  # noqa: E402
from moelab.reports import compare as cmp  # noqa: E402
from moelab.reports import hardware, query  # noqa: E402
from moelab.store.db import open_db, resolve_db_path  # noqa: E402
from moelab.store.labels import resolve_run  # noqa: E402


def per_op(con: Any, run_id: str) -> list[dict[str, Any]]:
    rows = con.execute(
        """SELECT r.backend, r.case_id, r.op, r.repeats, r.median_us, r.ci_low_us, r.ci_high_us, r.process_cv,
                  r.noise, r.stability,
                  list(p.median_us ORDER BY p.repeat), list(p.noise ORDER BY p.repeat)
           FROM results_judged r LEFT JOIN process_results p USING (run_id, backend, case_id, op)
           WHERE r.run_id = ? GROUP BY ALL ORDER BY r.backend, r.case_id, r.op""",
        [run_id],
    ).fetchall()
    keys = (
        "backend",
        "case_id",
        "op",
        "repeats",
        "median_us",
        "ci_low_us",
        "ci_high_us",
        "process_cv",
        "noise",
        "stability",
        "start_medians_us",
        "start_noise",
    )
    return [dict(zip(keys, r, strict=True)) for r in rows]


def between_backends(con: Any, run_id: str, reference: str | None) -> list[dict[str, Any]]:
    query.select_runs(con, [run_id])
    results, env = query.results(con), query.environment(con)
    table = cmp.build(
        results,
        env,
        query.runs(con),
        hardware.job_links(query.health_snapshots(con), env, PeakTable()),
        by="backend",
        reference=reference,
        processes=query.process_medians(con),
    )
    out = []
    for row in table.rows:
        for g in table.groups[1:]:
            r = table.ranking(row, g)
            if r is None:
                continue
            out.append(
                {
                    "case": row.label,
                    "op": row.op,
                    "sms": row.sms,
                    "backend": g,
                    "reference": table.reference,
                    "time_ratio": r.ratio,
                    "interval": [r.interval.low, r.interval.high] if r.interval else None,
                    "fastest_rank_ratio": r.fast_ratio,
                    "verdict": r.verdict,
                }
            )
    return out


def _us(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def show(ops: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> None:
    print(
        f"{'backend':<16} {'op':<15} {'n':>2} {'median µs':>10} {'95% interval µs':>21} {'CV':>6}  per start (noise)"
    )
    for o in ops:
        ci = f"[{_us(o['ci_low_us'])}, {_us(o['ci_high_us'])}]" if o["ci_low_us"] is not None else "—"
        cv = "—" if o["process_cv"] is None else f"{o['process_cv']:.1%}"
        starts = ", ".join(
            f"{_us(m)} ({'—' if n is None else f'{n:.1%}'})"
            for m, n in zip(o["start_medians_us"] or [], o["start_noise"] or [], strict=False)
            if m is not None
        )
        print(
            f"{o['backend']:<16} {o['op']:<15} {o['repeats']:>2} {_us(o['median_us']):>10} {ci:>21} {cv:>6}  {starts}"
        )
    if pairs:
        print()
        print(f"{'backend':<16} {'vs':<12} {'op':<15} {'time ratio':>10} {'95% interval':>16}  verdict")
        for p in pairs:
            ci = "—" if p["interval"] is None else f"[{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]"
            print(
                f"{p['backend']:<16} {p['reference']:<12} {p['op']:<15} {p['time_ratio']:>10.3f} {ci:>16}  {p['verdict']}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None, help="the store (default: as moelab's --db)")
    ap.add_argument("--run", default=None, help="run id or label (default: the newest run)")
    ap.add_argument(
        "--reference", default=None, help="the backend the others are held against (default: first)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    with open_db(resolve_db_path(args.db), read_only=True) as con:
        run_id = resolve_run(con, args.run) if args.run else query.latest_run_ids(con)[0]
        ops, pairs = per_op(con, run_id), between_backends(con, run_id, args.reference)
    print(f"run {run_id}")
    show(ops, pairs)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"run_id": run_id, "ops": ops, "between_backends": pairs}, indent=2))


if __name__ == "__main__":
    main()
