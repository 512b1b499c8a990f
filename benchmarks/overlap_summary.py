"""Issue 37's acceptance tables from a moelab store: per preset, EP and backend, every overlapped schedule's
speedup over its own serial layer (forward, forward+backward), the best of them against what the issue
asks, serial's exposed communication share, and the expert GEMMs' % of the dense matmul rate.

    python benchmarks/overlap_summary.py --db /tmp/r6/moelab.duckdb --run r6-ep2,r6-ep4

Runs whose ranks recorded different GPU models are summarised one machine at a time (a heading per
model): a serial layer timed on one GPU model is no baseline for a schedule timed on another.

Asked (issue 37): best >= 0.99x serial everywhere, forward and forward+backward; where serial's exposed
share s >= 10%, best >= 1 + s/2. GEMM % of dense = gemm_tflops_per_rank / dense_matmul_tflops (the run's
measured rate, a burst); >= 65% at DeepSeek-V3 (and Qwen3), >= 80% at the reference. Beside it, sust%: against
dense_matmul_sustained_tflops, the matmul run back to back at the GPU's power limit (results/h200x1-r19).

The best schedule's interval: the report's (moelab.reports.e2e_section.speedup_intervals, ~95% bootstrap
of the ratio of the medians; the iteration pairs resampled together where the case timed its serial layer
interleaved with itself). Against the 0.99 floor a reading is `met` (>= 0.99), `not excluded` (below,
but its interval reaches 0.99: the run cannot tell it from the floor) or `below` (its whole interval
under 0.99).

Ceiling: the most any schedule of a case's kind could gain over serial, from the case's own medians
(`ceiling`): however perfectly it overlapped, and even if the communication slowed no GEMM, a layer in n
token or expert parts still runs every part's expert compute (compute_only_split) plus, unhidden, at least
1/n of everything else of the serial layer (the first part's layout, dispatch and grouping cannot run
under a GEMM, nor the last part's combine); mode columns dispatches whole and hides at most n-1 of its n
combine slices, paying its split. Where the best ceiling is below what is asked, no schedule of those
kinds can meet it at that shape on that machine without a cheaper split or less work outside the GEMMs.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

import duckdb

from moelab.core.intervals import Interval
from moelab.core.models import MODELS
from moelab.reports.e2e_section import (
    best_serial_of,
    case_samples,
    layer_us,
    overlaps,
    speedup_intervals,
    vs_best_serial_interval,
)
from moelab.reports.query import json_obj, select

GEMM_NEED = {"deepseek-v3": 0.65, "qwen3-235b-a22b": 0.65, "reference": 0.80}


def preset_of(hidden: int, topk: int, intermediate: int | None) -> str:
    for m in MODELS.values():
        if (m.hidden, m.topk, m.intermediate) == (hidden, topk, intermediate):
            return m.name
    return "reference" if hidden == 8192 else f"h{hidden}-k{topk}-i{intermediate}"


def need(share: float | None) -> float:
    return 1 + share / 2 if share is not None and share >= 0.10 else 0.99


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


CEILING_OPS = ("layer_serial", "compute_only", "compute_only_split", "combine")


def ceiling(schedule: str, ops: dict[str, float]) -> float | None:
    """The upper bound on speedup_vs_serial of a schedule of this kind (module docstring), or None where
    the case lacks an op it needs or the schedule is not a split one."""
    if any(op not in ops for op in CEILING_OPS):
        return None
    base = schedule.removeprefix("auto:").split("+")[0]
    mode, _, count = base.partition("/")
    parts = 2 if mode == "tbo" else int(count) if count.isdigit() else 0
    if parts < 2:
        return None
    serial, whole, split = ops["layer_serial"], ops["compute_only"], ops["compute_only_split"]
    if mode == "columns":
        floor = serial - ops["combine"] * (parts - 1) / parts + max(0.0, split - whole)
    elif mode in ("tbo", "chunked", "expert"):
        floor = split + max(0.0, serial - whole) / parts
    else:
        return None
    return serial / floor if floor > 0 else None


FLOOR = 0.99


def floor_verdict(value: float | None, ci: Interval | None) -> str:
    """Where a best-schedule speedup stands against the 0.99 floor, given its interval (module docstring)."""
    if value is None:
        return "-"
    if value >= FLOOR:
        return "met"
    return "not excluded" if ci is not None and ci.high >= FLOOR else "below"


def ci_text(ci: Interval | None) -> str:
    return "[-]" if ci is None else ci.text(".3f")


def gemm_rates(rows: list[dict[str, Any]], rate: str = "dense_matmul_tflops") -> list[float]:
    """Each case's GEMM FLOP rate as a share of the run's dense matmul `rate` (the burst, or
    `dense_matmul_sustained_tflops`: back to back, at the power limit), where both were stored."""
    return [
        r["m"]["gemm_tflops_per_rank"] / r["m"][rate]
        for r in rows
        if r["m"].get("gemm_tflops_per_rank") and r["m"].get(rate)
    ]


def span(shares: list[float]) -> str:
    return f"{100 * min(shares):.1f}-{100 * max(shares):.1f}%" if shares else "-"


def fastest_vs_best_serial(
    rows: list[dict[str, Any]], way: str
) -> tuple[dict[str, Any], float, tuple[int | None, float]] | None:
    """The fastest overlapped layer ("fwd" or "fwd_bwd"), its time, and the fastest serial layer of any SM
    count (moelab.reports.e2e_section.best_serial), or None where either is missing."""
    timed = [
        (r, us)
        for r in rows
        if overlaps(r["timing"]["mode"], r["schedule"]) and (us := layer_us(r["timing"], way))
    ]
    base = best_serial_of([r["timing"] for r in rows], way)
    if not timed or base is None:
        return None
    top, us = min(timed, key=lambda t: t[1])
    return top, us, base


def vs_best_serial(rows: list[dict[str, Any]]) -> str:
    """The summary's third table's line: the fastest overlapped layer, forward and forward+backward, against
    the fastest serial layer, with the interval of that ratio (moelab.reports.e2e_section.vs_best_serial_interval)."""
    cells = []
    for way, width in (("fwd", (40, 26)), ("fwd_bwd", (30, 18))):
        found = fastest_vs_best_serial(rows, way)
        if found is None:
            cells.append(f"{'-':{width[0]}} {'-':{width[1]}} {'-':>6} {'-':18}")
            continue
        top, us, (sms, base) = found
        name = f"{top['schedule']}@{top['sms'] if top['sms'] is not None else 'def'} {us / 1e3:.2f}"
        serial = f"{sms if sms is not None else 'def'} {base / 1e3:.2f}"
        ci = vs_best_serial_interval([r["timing"] for r in rows], top["timing"], way, sms)
        cells.append(f"{name:{width[0]}} {serial:{width[1]}} {base / us:6.3f} {ci_text(ci):18}")
    return "   ".join(cells)


def held_to_best_serial(best: float, rows: list[dict[str, Any]], way: str) -> float:
    """A best in-case speedup, no higher than the fastest overlapped layer against the fastest serial layer:
    a schedule held to few SMs beats its serial layer, held to as few, more easily than the best serial."""
    found = fastest_vs_best_serial(rows, way)
    return min(best, found[2][1] / found[1]) if found is not None else best


def time_budget(rows: list[dict[str, Any]]) -> str | None:
    """The fourth table's line: where the fastest overlapped layer's time goes against its own serial layer
    (forward, the case's stored medians): layer = serial + split cost + schedule overhead, where the
    schedule overhead is what the schedule adds beyond its split less the communication it hides (negative
    where it hides more than it adds), beside what the overhead would have to be to meet the issue's ask
    and the GEMM slowdown under communication. None where no overlapped layer was timed."""
    found = fastest_vs_best_serial(rows, "fwd")
    if found is None:
        return None
    top, layer, _ = found
    m = top["m"]
    serial = layer * m["speedup_vs_serial"] if m.get("speedup_vs_serial") else None
    share, split, sched = (
        m.get("serial_exposed_comm_share"),
        m.get("split_overhead_us"),
        m.get("schedule_overhead_us"),
    )
    if serial is None or split is None or sched is None:
        return None
    needed = serial / need(share) - serial - split
    exposed = share * serial if share is not None else None
    slow = m.get("gemm_slowdown")
    name = f"{top['schedule']}@{top['sms'] if top['sms'] is not None else 'def'}"
    return (
        f"{name[:26]:26} {serial / 1e3:7.2f} {fmt(exposed / 1e3 if exposed is not None else None, '.2f'):>8} "
        f"{split / 1e3:+6.2f} {sched / 1e3:+9.2f} {needed / 1e3:+9.2f} {layer / 1e3:7.2f} "
        f"{fmt(100 * slow if slow is not None else None, '+.0f'):>5}%"
    )


def missing_runs(con: duckdb.DuckDBPyConnection, runs: list[str], cases: list[tuple[Any, ...]]) -> str | None:
    """Why the summary would print empty tables for `runs` (a run not in the store, or no MoE-layer case in
    those runs), naming what the store holds; None where there is something to summarise."""
    found = {c[0] for c in cases}
    absent = [r for r in runs if r not in found]
    if absent:
        known = sorted(r for (r,) in con.execute("SELECT run_id FROM runs").fetchall())
        shown = ", ".join(known[:12]) + (f" and {len(known) - 12} more" if len(known) > 12 else "")
        return f"no case of run {', '.join(absent)} in this store (its runs: {shown or 'none'})"
    if not any(json_obj(c[10]).get("bench") == "e2e" for c in cases):
        return f"run {', '.join(runs)} holds no MoE-layer case (bench = e2e): nothing to summarise"
    return None


def print_tables(groups: dict[tuple[str, int, str], list[dict[str, Any]]]) -> None:
    """The summary's tables for the cases of one machine (GPU model), grouped by preset, EP and backend."""
    print(
        f"{'preset':16} {'EP':>2} {'backend':9} {'schedules (fwd | fwd+bwd speedup vs serial)':70} "
        f"{'best fwd':>8} {'best f+b':>8} {'exposed':>7} {'need':>5} {'verdict':8} {'GEMM%':>6} {'sust%':>5} "
        f"{'ceiling':>24} gemm"
    )
    for (preset, ep, backend), rows in sorted(groups.items()):
        parts = []
        for r in sorted(rows, key=lambda r: -(r["m"].get("speedup_vs_serial") or 0)):
            s = r["schedule"] + (f"@{r['sms']}" if r["sms"] is not None else "")
            parts.append(
                f"{s} {fmt(r['m'].get('speedup_vs_serial'), '.2f')}|{fmt(r['m'].get('speedup_vs_serial_fwd_bwd'), '.2f')}"
            )
        best_f = max((r["m"].get("speedup_vs_serial") or 0 for r in rows), default=0)
        best_b = max((r["m"].get("speedup_vs_serial_fwd_bwd") or 0 for r in rows), default=0)
        shares = [
            r["m"].get("serial_exposed_comm_share")
            for r in rows
            if r["m"].get("serial_exposed_comm_share") is not None
        ]
        share = sorted(shares)[len(shares) // 2] if shares else None
        want = need(share)
        # the verdict holds both readings to what is asked: in-case, and against the fastest serial layer
        held_f, held_b = (
            held_to_best_serial(best_f, rows, "fwd"),
            held_to_best_serial(best_b, rows, "fwd_bwd"),
        )
        verdict = (
            "MET"
            if held_f >= want and held_b >= 0.99 and (share is None or share < 0.10 or held_b >= want)
            else "NOT MET"
        )
        gemm = gemm_rates(rows)
        gemm_pct = max(gemm) if gemm else None
        sustained = gemm_rates(rows, "dense_matmul_sustained_tflops")
        stext = fmt(100 * max(sustained), ".0f") + "%" if sustained else "-"
        impls = sorted({r["rec"].get("gemm", "?") for r in rows})
        gneed = GEMM_NEED.get(preset)
        top = max((r for r in rows if r["ceiling"] is not None), key=lambda r: r["ceiling"], default=None)
        ctext = f"{top['ceiling']:.3f} {top['schedule']}"[:24] if top is not None else "-"
        gtext = fmt(100 * gemm_pct, ".0f") + "%" if gemm_pct is not None else "-"
        if gneed is not None and gemm_pct is not None:
            gtext += "" if gemm_pct >= gneed else "!"
        print(
            f"{preset:16} {ep:>2} {backend:9} {'; '.join(parts)[:70]:70} {best_f:8.3f} {best_b:8.3f} "
            f"{fmt(100 * share if share is not None else None, '.0f'):>6}% {want:5.2f} {verdict:8} {gtext:>6} {stext:>5} "
            f"{ctext:>24} {','.join(impls)}"
        )
    print(
        "\nGEMM% ends in ! where below the issue's floor for that preset (65% DeepSeek-V3/Qwen3, 80% reference);"
        "\nsust%: the same GEMMs against the dense matmul run back to back at the power limit (runs from round 20);"
        "\nceiling: the most the best schedule of the kinds measured could gain, from each case's own medians"
    )
    print(
        f"\n{'preset':16} {'EP':>2} {'backend':9} {'best fwd (schedule, speedup, interval)':46} {'vs 0.99':12} "
        f"{'best fwd+bwd (schedule, speedup, interval)':46} vs 0.99"
    )
    for (preset, ep, backend), rows in sorted(groups.items()):
        cells = []
        for metric, way in (("speedup_vs_serial", "fwd"), ("speedup_vs_serial_fwd_bwd", "fwd_bwd")):
            top = max(
                (r for r in rows if r["m"].get(metric) is not None),
                key=lambda r: r["m"][metric],
                default=None,
            )
            if top is None:
                cells += [f"{'-':46}", f"{'-':12}"]
                continue
            value, ci = top["m"][metric], top["ci"].get(way)
            cells += [
                f"{top['schedule'][:20]:20} {value:.3f} {ci_text(ci):18}",
                f"{floor_verdict(value, ci):12}",
            ]
        print(f"{preset:16} {ep:>2} {backend:9} {' '.join(cells)}")
    print(
        "interval: ~95% bootstrap of serial / schedule (iteration pairs resampled together where timed "
        "interleaved); vs 0.99: met, not excluded (its interval reaches 0.99) or below"
    )
    print(
        f"\n{'preset':16} {'EP':>2} {'backend':9} {'fastest overlapped fwd (sched@SMs, ms)':40} "
        f"{'best serial fwd (SMs, ms)':26} {'vs it':>6} {'interval':18}   {'fastest f+b':30} {'best serial f+b':18} "
        f"{'vs it':>6} interval"
    )
    for (preset, ep, backend), rows in sorted(groups.items()):
        print(f"{preset:16} {ep:>2} {backend:9} {vs_best_serial(rows)}")
    print(
        "vs it: the fastest serial layer measured for the preset on that backend (per SM count the median of "
        "its cases' serial layers, then the fastest) / the fastest overlapped layer. Where the cases hold the "
        "communication to different SM counts, the in-case speedups above compare each schedule with a serial "
        "layer held to the same count; this does not. interval: ~95% bootstrap, unpaired, of the fastest "
        "overlapped layer's iterations against the serial iterations of every case at the best serial SM count"
    )
    print(
        f"\n{'preset':16} {'EP':>2} {'backend':9} {'fastest overlapped fwd':26} {'serial':>7} {'exposed':>8} "
        f"{'split':>6} {'schedule':>9} {'to meet':>9} {'layer':>7} {'GEMM+':>6}"
    )
    for (preset, ep, backend), rows in sorted(groups.items()):
        line = time_budget(rows)
        if line is not None:
            print(f"{preset:16} {ep:>2} {backend:9} {line}")
    print(
        "ms, forward, the case's own medians: layer = serial + split + schedule. split: the expert compute in "
        "parts less whole; schedule: what the schedule adds beyond its split less the communication it hides "
        "(negative: hid more than it added); to meet: the schedule figure the issue's ask needs (serial / "
        "need - serial - split); exposed: serial's communication the GEMMs wait for; GEMM+: one part's GEMMs "
        "under communication against alone"
    )
    by_impl: dict[tuple[str, int, str, str], list[dict[str, Any]]] = defaultdict(list)
    for (preset, ep, backend), rows in groups.items():
        for r in rows:
            by_impl[(preset, ep, backend, r["rec"].get("gemm", "?"))].append(r)
    if len({k[3] for k in by_impl}) > 1:  # several GEMM implementations ran: each one's rate apart
        print(
            f"\n{'preset':16} {'EP':>2} {'backend':9} {'gemm':12} {'cases':>5} {'GEMM% (FLOP rate) min-max':>26} "
            f"{'roofline share min-max':>23} {'gemm ms':>8}"
        )
        for (preset, ep, backend, impl), rows in sorted(by_impl.items()):
            rate = gemm_rates(rows)
            share = [r["m"]["gemm_roofline_share"] for r in rows if r["m"].get("gemm_roofline_share")]
            gemm_ms = [r["ms_gemm"] for r in rows if r.get("ms_gemm")]
            ms = f"{sorted(gemm_ms)[len(gemm_ms) // 2]:.2f}" if gemm_ms else "-"
            print(
                f"{preset:16} {ep:>2} {backend:9} {impl:12} {len(rows):5} {span(rate):>26} {span(share):>23} {ms:>8}"
            )
        print("GEMM% (FLOP rate): GEMM FLOPs / time / dense; roofline share also credits the SwiGLU bytes")


def machines_of(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], str]:
    """Per (run, backend) of the selected runs (the temp table _sel), the machine its job ran on as the
    summary keeps them apart: the GPU model(s) its ranks recorded ("cpu" where none). A serial layer timed
    on one GPU model is no baseline for a schedule timed on another, so runs of two machines are
    summarised one machine at a time."""
    gpu = "coalesce(gpu_name, 'cpu')"
    return {
        (r["run_id"], r["backend"]): str(r["gpus"])
        for r in select(
            con,
            f"""SELECT run_id, backend, string_agg(DISTINCT {gpu}, ' + ' ORDER BY {gpu}) AS gpus
                FROM environment SEMI JOIN _sel USING (run_id) GROUP BY run_id, backend""",
        )
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", required=True, help="run ids, comma-separated")
    args = ap.parse_args()
    runs = [r for r in args.run.split(",") if r]
    con = duckdb.connect(args.db, read_only=True)
    marks = ", ".join("?" for _ in runs)
    cases = con.execute(
        f"SELECT run_id, backend, case_id, status, reason, sms, hidden, topk, experts_per_rank, world, knobs, "
        f"backend_record, tokens_per_rank FROM cases WHERE run_id IN ({marks})",
        runs,
    ).fetchall()
    missing = missing_runs(con, runs, cases)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        raise SystemExit(2)
    metrics: dict[tuple[str, str, str], dict[str, float | None]] = defaultdict(dict)
    for run, backend, case, name, value in con.execute(
        f"SELECT run_id, backend, case_id, name, value FROM case_metrics WHERE run_id IN ({marks})", runs
    ).fetchall():
        metrics[(run, backend, case)][name] = value
    ops: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for run, backend, case, op, us in con.execute(
        f"SELECT run_id, backend, case_id, op, median_us FROM results WHERE run_id IN ({marks})", runs
    ).fetchall():
        ops[(run, backend, case)][op] = us
    con.execute("CREATE OR REPLACE TEMP TABLE _sel AS SELECT UNNEST(?::VARCHAR[]) AS run_id", [runs])
    samples = case_samples(con)
    intervals = speedup_intervals(con, samples)
    machine_of = machines_of(con)
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = defaultdict(list)
    refused: dict[str, int] = defaultdict(int)
    for run, backend, case, status, reason, sms, hidden, topk, _epr, world, knobs, record, tokens in cases:
        knobs = json_obj(knobs)
        if knobs.get("bench") != "e2e":
            continue
        rec = json_obj(record).get("e2e", {})
        inter = rec.get("intermediate", knobs.get("intermediate"))
        key = (
            machine_of.get((run, backend), "unknown machine"),
            preset_of(hidden, topk, inter),
            world,
            backend,
        )
        if status != "ok":
            refused[f"{backend} {status}: {(reason or '')[:110]}"] += 1
            continue
        schedule, case_ops = rec.get("schedule", knobs.get("mode")), ops[(run, backend, case)]
        groups[key].append(
            {
                "schedule": schedule,
                "sms": sms,
                "m": metrics[(run, backend, case)],
                "rec": rec,
                "ms_gemm": case_ops.get("gemm", 0) / 1e3,
                "ceiling": ceiling(schedule or "", case_ops),
                "ci": intervals.get((run, backend, case), {}),
                # the fields moelab.reports.e2e_section.serial_us reads
                "timing": {
                    "mode": knobs.get("mode", "serial"),
                    "tokens_per_rank": tokens,
                    "sms": sms,
                    "samples": samples.get((run, backend, case), {}),
                }
                | metrics[(run, backend, case)],
            }
        )
    # one machine's tables at a time: a serial layer timed on one is no baseline for a schedule on another
    machines = sorted({key[0] for key in groups})
    for n, name in enumerate(machines):
        if len(machines) > 1:
            print(f"{chr(10) if n else ''}== {name} ==")
        print_tables({key[1:]: rows for key, rows in groups.items() if key[0] == name})
    if refused:
        print("\nnot measured:")
        for text, n in sorted(refused.items()):
            print(f"  {n:3} x {text}")


if __name__ == "__main__":
    main()
