"""The report's end-to-end section: for each MoE-layer workload, tokens/s per rank against the SMs the
communication holds, every backend and schedule on one chart, each line's best SM count marked, the
winning backend+S named, and the figures behind it (exposed communication, overlap efficiency, the GEMM
slowdown the communication's SMs cause, the layer's and its compute's % of roofline). Rows come from the e2e cases' stored metrics (moelab.measure.e2e).

Each block also names, per backend, the fastest overlapped layer (moelab.measure.e2e.schedules) and its
speedup over its own serial layer, forward and forward+backward, each with the bootstrap interval of the
ratio of the two layers' medians (slowest rank per iteration, from the stored samples; the iteration
pairs resampled together where the case timed the two interleaved), and over the fastest serial layer
measured for the workload at any SM count, with the interval of that ratio too (`best_schedules`)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import duckdb

from moelab.core.e2e_spec import GEMM_TILES, SERIAL_TIMING
from moelab.core.intervals import Interval, interleaved_ratio_interval, ratio_interval
from moelab.reports import charts
from moelab.reports.query import json_obj, select

METRICS = (
    "layer_us",
    "tokens_per_s_per_rank",
    "exposed_comm_us",
    "overlap_efficiency",
    "gemm_slowdown",
    "speedup_vs_serial",
    "tokens_per_s_per_rank_fwd_bwd",
    "roofline_share",
    "compute_roofline_share",
    "speedup_vs_serial_fwd_bwd",
    "sms_taken_from_gemms",
    "exposed_comm_share",
    "serial_exposed_comm_share",
)
SPEEDUPS = {"fwd": ("layer_serial", "layer"), "fwd_bwd": ("layer_fwd_bwd_serial", "layer_fwd_bwd")}


def case_samples(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """Per e2e case of the selected runs, each layer op's time per iteration (its slowest rank's): the layer,
    forward and forward+backward, and the serial layer an overlapped case timed beside it."""
    ops = sorted({op for pair in SPEEDUPS.values() for op in pair})
    samples: dict[tuple[str, str, str, str], dict[int, dict[int, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in select(
        con,
        f"""SELECT run_id, backend, case_id, op, rank, iter, time_us FROM samples SEMI JOIN _sel USING (run_id)
            WHERE op IN ({", ".join("'" + op + "'" for op in ops)})""",
    ):
        samples[(r["run_id"], r["backend"], r["case_id"], r["op"])][r["rank"]][r["iter"]] = r["time_us"]
    out: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(dict)
    for (run, backend, case, op), per_rank in samples.items():
        out[(run, backend, case)][op] = _slowest(per_rank)
    return out


def _slowest(per_rank: dict[int, dict[int, float]]) -> list[float]:
    """The slowest rank's time per iteration (iterations every rank has)."""
    ranks = list(per_rank.values())
    iters = sorted(set.intersection(*(set(r) for r in ranks))) if ranks else []
    return [max(r[i] for r in ranks) for i in iters]


def speedup_intervals(
    con: duckdb.DuckDBPyConnection,
    samples: dict[tuple[str, str, str], dict[str, list[float]]] | None = None,
) -> dict[tuple[str, str, str], dict[str, Interval | None]]:
    """Per overlapped e2e case of the selected runs, the interval of serial / schedule time, forward and
    forward+backward, from the stored samples (`case_samples`, read here unless given). A case whose
    record says it timed the two interleaved (e2e.serial_timing) has its iteration pairs resampled
    together; a store from before timed them apart, so its intervals are unpaired."""
    interleaved = {
        (c["run_id"], c["backend"], c["case_id"])
        for c in select(
            con, "SELECT run_id, backend, case_id, backend_record FROM cases SEMI JOIN _sel USING (run_id)"
        )
        if json_obj(c["backend_record"]).get("e2e", {}).get("serial_timing") == SERIAL_TIMING
    }
    out: dict[tuple[str, str, str], dict[str, Interval | None]] = defaultdict(dict)
    for key, ops in (case_samples(con) if samples is None else samples).items():
        for name, (serial_op, layer_op) in SPEEDUPS.items():
            if layer_op not in ops or serial_op not in ops:
                continue
            serial, layer = ops[serial_op], ops[layer_op]
            interval = interleaved_ratio_interval if key in interleaved else ratio_interval
            out[key][name] = interval(layer, serial) if serial and layer else None
    return out


def e2e_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """One row per stored e2e case of the selected runs (the temp table _sel), its metrics as columns."""
    cases = select(
        con,
        """SELECT c.run_id, c.backend, c.case_id, c.sms, c.knobs, c.hidden, c.tokens_per_rank, c.topk,
              c.experts_per_rank, c.world, c.dtype, c.backend_record
           FROM cases c SEMI JOIN _sel USING (run_id) WHERE c.status = 'ok'""",
    )
    metrics: dict[tuple[str, str, str], dict[str, float | None]] = defaultdict(dict)
    for m in select(
        con,
        "SELECT run_id, backend, case_id, name, value FROM case_metrics SEMI JOIN _sel USING (run_id)",
    ):
        metrics[(m["run_id"], m["backend"], m["case_id"])][m["name"]] = m["value"]
    samples = case_samples(con)
    intervals = speedup_intervals(con, samples)
    out = []
    for c in cases:
        knobs = json_obj(c["knobs"])
        if knobs.get("bench") != "e2e":
            continue
        e2e = json_obj(c["backend_record"]).get("e2e", {})
        m = metrics.get((c["run_id"], c["backend"], c["case_id"]), {})
        if m.get("tokens_per_s_per_rank") is None:
            continue
        extra = {
            k: v
            for k, v in knobs.items()
            if k not in ("bench", "mode", "intermediate", "profile", "backward", "chunks", "comm")
        }
        ci = intervals.get((c["run_id"], c["backend"], c["case_id"]), {})
        out.append(
            c
            | {
                "mode": knobs.get("mode", "serial"),
                "schedule": e2e.get("schedule", knobs.get("mode", "serial")),
                "speedup_ci": ci.get("fwd"),
                "speedup_fwd_bwd_ci": ci.get("fwd_bwd"),
                "samples": samples.get((c["run_id"], c["backend"], c["case_id"]), {}),
                "intermediate": e2e.get("intermediate", knobs.get("intermediate")),
                "knob_text": ", ".join(f"{k}={v}" for k, v in sorted(extra.items())),
                "gemm_text": gemm_text(e2e),
                **{name: m.get(name) for name in METRICS},
            }
        )
    return out


def gemm_text(e2e: dict[str, Any]) -> str:
    """The expert GEMM a case ran, as its record says: the implementation, the parts' where an overlapped
    schedule chose another, and each one's CUTLASS tile where the kernel name told it."""

    def tile(kernels: Any) -> str:  # gemm_kernels leads a kernel with "<tile>: " where it knows the tile
        first = str(kernels[0]) if isinstance(kernels, list) and kernels else ""
        head = first.split(": ", 1)[0]
        return f" ({head})" if head in GEMM_TILES.values() and first != head else ""

    whole = e2e.get("gemm")
    if not whole:
        return "—"
    text = f"{whole}{tile(e2e.get('gemm_kernels'))}"
    part = e2e.get("gemm_part")
    if part and (part != whole or tile(e2e.get("gemm_kernels_part")) != tile(e2e.get("gemm_kernels"))):
        text += f"; parts {part}{tile(e2e.get('gemm_kernels_part'))}"
    return text


def _series_name(r: dict[str, Any]) -> str:
    name = f"{r['backend']} {r.get('schedule', r['mode'])} ({r['dtype']})"
    return f"{name} {r['knob_text']}" if r["knob_text"] else name


def _sms_text(sms: int | None) -> str:
    return "default" if sms is None else str(sms)


WORKLOAD_KEYS = ("hidden", "tokens_per_rank", "topk", "experts_per_rank", "world", "intermediate")


def build(rows: Sequence[dict[str, Any]], draw: bool = True) -> list[dict[str, Any]]:
    """One block per (run, workload): chart, per-series best S, winner, table."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["run_id"],) + tuple(r[k] for k in WORKLOAD_KEYS)].append(r)
    return [
        _block(n, key, grows, draw)
        for n, (key, grows) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0])))
    ]


def _block(n: int, key: tuple[Any, ...], grows: list[dict[str, Any]], draw: bool) -> dict[str, Any]:
    _, hidden, tokens, topk, epr, world, inter = key
    best, series = _best_per_series(grows)
    winner = max(grows, key=lambda r: r["tokens_per_s_per_rank"])
    ranked = sorted(grows, key=lambda r: -r["tokens_per_s_per_rank"])
    runner = next((r for r in ranked[1:] if r["backend"] != winner["backend"]), None)
    workload = f"hidden {hidden}, {tokens} tokens/rank, topk {topk}, {epr} experts/rank, {world} ranks, intermediate {inter}"
    svg = ""
    if draw and series:
        svg = charts.line_chart(
            series, "MoE layer: tokens/s vs communication SMs", "communication SMs", "tokens/s per rank"
        )
    return {
        "id": f"e2e-chart-{n + 1}",
        "run_id": key[0],
        "workload": workload,
        "svg": svg,
        "best": best,
        "winner": {
            "backend": winner["backend"],
            "mode": winner.get("schedule", winner["mode"]),
            "sms": _sms_text(winner["sms"]),
            "knobs": winner["knob_text"],
            "tokens_per_s": winner["tokens_per_s_per_rank"],
        },
        "margin_other_backend": (
            winner["tokens_per_s_per_rank"] / runner["tokens_per_s_per_rank"] - 1 if runner else None
        ),
        "other_backend": _series_name(runner) + f" at {_sms_text(runner['sms'])} SMs" if runner else None,
        "best_schedules": best_schedules(grows),
        "rows": sorted(
            grows,
            key=lambda r: (r["backend"], r["mode"], r["knob_text"], r["sms"] is not None, r["sms"] or 0),
        ),
    }


def layer_us(r: dict[str, Any], way: str) -> float | None:
    """A case's own layer time (µs), forward ("fwd") or forward+backward ("fwd_bwd", from its tokens/s)."""
    if way == "fwd":
        return float(r["layer_us"]) if r.get("layer_us") is not None else None
    tps = r.get("tokens_per_s_per_rank_fwd_bwd")
    return r["tokens_per_rank"] / tps * 1e6 if tps else None


def serial_us(r: dict[str, Any], way: str) -> float | None:
    """The serial layer time (µs) a case measured, forward or forward+backward: a serial case's own layer,
    an overlapped case's in-case baseline (its layer time x its speedup over it, the ratio of the two
    medians)."""
    layer = layer_us(r, way)
    if layer is None or r["mode"] == "serial":
        return layer
    speedup = r.get("speedup_vs_serial" if way == "fwd" else "speedup_vs_serial_fwd_bwd")
    return layer * speedup if speedup is not None else None


def best_serial(points: Sequence[tuple[int | None, float]]) -> tuple[int | None, float] | None:
    """The fastest serial layer among (SMs, serial µs) readings: per SM count the median of its readings
    (every overlapped case times its own serial layer: their median, not their minimum, so the noise of
    many cases does not pull the baseline down), then the fastest SM count."""
    by_sms: dict[int | None, list[float]] = defaultdict(list)
    for sms, us in points:
        by_sms[sms].append(us)
    if not by_sms:
        return None
    medians = {sms: statistics.median(v) for sms, v in by_sms.items()}
    sms = min(medians, key=lambda k: medians[k])
    return sms, medians[sms]


def best_serial_of(rows: Sequence[dict[str, Any]], way: str) -> tuple[int | None, float] | None:
    """`best_serial` over every serial reading the cases hold (`serial_us`), each at its case's SMs."""
    return best_serial([(r["sms"], us) for r in rows if (us := serial_us(r, way)) is not None])


def overlaps(mode: str, schedule: str | None) -> bool:
    """A case whose layer overlaps its communication: not serial, nor mode auto having chosen serial (its
    layer is a serial layer; its speedup over serial is noise about 1)."""
    return mode != "serial" and schedule != "auto:serial"


def serial_samples(r: dict[str, Any], way: str) -> list[float]:
    """The serial layer's times per iteration a case holds (`samples`, from `case_samples`): a serial case's
    own layer, an overlapped case's in-case baseline."""
    serial_op, layer_op = SPEEDUPS[way]
    return list(r.get("samples", {}).get(layer_op if r["mode"] == "serial" else serial_op, []))


def vs_best_serial_interval(
    rows: Sequence[dict[str, Any]], top: dict[str, Any], way: str, sms: int | None
) -> Interval | None:
    """The bootstrap interval of best serial / `top`'s layer: unpaired (they are different cases), the
    iterations of `top` against those of every serial reading at the best serial SM count `sms`, pooled;
    None where either side has fewer than two (a store without samples)."""
    layer = list(top.get("samples", {}).get(SPEEDUPS[way][1], []))
    base = [x for r in rows if r["sms"] == sms for x in serial_samples(r, way)]
    return ratio_interval(layer, base)


def best_schedules(grows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backend, its fastest overlapped layer (forward): the schedule, its SMs, the SMs it took from the
    GEMMs, its speedups over its own serial layer with their intervals, and over the fastest serial layer
    the workload measured on that backend (`best_serial`) with theirs (`vs_best_serial_interval`). The two
    differ where cases hold the communication to different SM counts: a schedule at 8 SMs against a serial
    layer also held to 8 SMs can read 1.12 in-case and lose to the serial layer at the library's default
    (4 x H200, reference, DeepEP: results/h200x4-r16); the table shows both. Mode auto having chosen
    serial is no overlapped layer (`overlaps`)."""
    by_backend: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in grows:
        if (
            overlaps(r["mode"], r.get("schedule"))
            and r.get("speedup_vs_serial") is not None
            and r.get("layer_us")
        ):
            by_backend[r["backend"]].append(r)
    out = []
    for backend, rows in sorted(by_backend.items()):
        top = min(rows, key=lambda r: r["layer_us"])
        mine = [r for r in grows if r["backend"] == backend]
        serial = [r for r in mine if r["mode"] == "serial" and r["sms"] == top["sms"]]
        layer_fb = layer_us(top, "fwd_bwd")
        fwd, fb = best_serial_of(mine, "fwd"), best_serial_of(mine, "fwd_bwd")
        out.append(
            {
                "backend": backend,
                "schedule": top.get("schedule", top["mode"]),
                "sms": _sms_text(top["sms"]),
                "knobs": top["knob_text"],
                "sms_taken": _count(top.get("sms_taken_from_gemms")),
                "speedup": top["speedup_vs_serial"],
                "speedup_ci": _ci_text(top.get("speedup_ci")),
                "speedup_fwd_bwd": top.get("speedup_vs_serial_fwd_bwd"),
                "speedup_fwd_bwd_ci": _ci_text(top.get("speedup_fwd_bwd_ci")),
                "vs_best_serial": fwd[1] / top["layer_us"] if fwd else None,
                "vs_best_serial_ci": _ci_text(
                    vs_best_serial_interval(mine, top, "fwd", fwd[0]) if fwd else None
                ),
                "vs_best_serial_fwd_bwd": fb[1] / layer_fb if fb and layer_fb else None,
                "vs_best_serial_fwd_bwd_ci": _ci_text(
                    vs_best_serial_interval(mine, top, "fwd_bwd", fb[0]) if fb and layer_fb else None
                ),
                "best_serial_sms": _sms_text(fwd[0]) if fwd else "—",
                "serial_exposed_share": (
                    top.get("serial_exposed_comm_share")
                    if top.get("serial_exposed_comm_share") is not None
                    else (serial[0].get("exposed_comm_share") if serial else None)
                ),
                "schedules_tried": len(rows),
                "gemm": top.get("gemm_text", "—"),
            }
        )
    return out


def _count(value: float | None) -> int | None:
    """An SM count stored as a metric (a float) as the count it is: 24, not 24.0."""
    return None if value is None else int(round(value))


def _ci_text(ci: Interval | None) -> str:
    return ci.text(".3f") if ci is not None else "—"


def _best_per_series(
    grows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, charts.Series]]:
    """Each series' best SM count (table) and, over its numeric SM counts, its line with the best marked."""
    by_series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in grows:
        by_series[_series_name(r)].append(r)
    best = []
    series = {}
    for name, srows in sorted(by_series.items()):
        top = max(srows, key=lambda r: r["tokens_per_s_per_rank"])
        best.append(
            {"series": name, "sms": _sms_text(top["sms"]), "tokens_per_s": top["tokens_per_s_per_rank"]}
        )
        numeric = sorted((r for r in srows if r["sms"] is not None), key=lambda r: r["sms"])
        if numeric:
            marks = (
                ((top["sms"], top["tokens_per_s_per_rank"], f"best {top['sms']}"),)
                if top["sms"] is not None
                else ()
            )
            series[name] = charts.Series(
                xs=[r["sms"] for r in numeric], ys=[r["tokens_per_s_per_rank"] for r in numeric], marks=marks
            )
    return best, series
