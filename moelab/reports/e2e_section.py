"""The report's end-to-end section: for each MoE-layer workload, tokens/s per rank against the SMs the
communication holds, every backend and schedule on one chart, each line's best SM count marked, the
winning backend+S named, and the figures behind it (exposed communication, overlap efficiency, the GEMM
slowdown the communication's SMs cause, the layer's and its compute's % of roofline). Rows come from the e2e cases' stored metrics (moelab.measure.e2e)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import duckdb

from moelab.reports import charts
from moelab.reports.query import select

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
)


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
    out = []
    for c in cases:
        knobs = _obj(c["knobs"])
        if knobs.get("bench") != "e2e":
            continue
        e2e = _obj(c["backend_record"]).get("e2e", {})
        m = metrics.get((c["run_id"], c["backend"], c["case_id"]), {})
        if m.get("tokens_per_s_per_rank") is None:
            continue
        extra = {
            k: v
            for k, v in knobs.items()
            if k not in ("bench", "mode", "intermediate", "profile", "backward")
        }
        out.append(
            c
            | {
                "mode": knobs.get("mode", "serial"),
                "intermediate": e2e.get("intermediate", knobs.get("intermediate")),
                "knob_text": ", ".join(f"{k}={v}" for k, v in sorted(extra.items())),
                **{name: m.get(name) for name in METRICS},
            }
        )
    return out


def _obj(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _series_name(r: dict[str, Any]) -> str:
    name = f"{r['backend']} {r['mode']} ({r['dtype']})"
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
            "mode": winner["mode"],
            "sms": _sms_text(winner["sms"]),
            "knobs": winner["knob_text"],
            "tokens_per_s": winner["tokens_per_s_per_rank"],
        },
        "margin_other_backend": (
            winner["tokens_per_s_per_rank"] / runner["tokens_per_s_per_rank"] - 1 if runner else None
        ),
        "other_backend": _series_name(runner) + f" at {_sms_text(runner['sms'])} SMs" if runner else None,
        "rows": sorted(
            grows,
            key=lambda r: (r["backend"], r["mode"], r["knob_text"], r["sms"] is not None, r["sms"] or 0),
        ),
    }


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
