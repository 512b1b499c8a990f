"""The report's sections, built from plain query rows: hardware panel, each row's link peak (what its
machine reported: moelab.reports.hardware) and fractions of it, SM sweeps with knees, token sweeps with
alpha/beta fits. Flags are moelab.reports.flags', the summary moelab.reports.summary's. No SQL and no HTML
here."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moelab.core.ops import OPS
from moelab.reports import charts, hardware
from moelab.reports.analysis import fit_alpha_beta, fraction_of_peak, knee
from moelab.reports.hardware import JobLinks

FLAGGED_OPS = (
    "dispatch",
    "dispatch_fresh",
    "combine",
)  # roundtrip moves both directions: a per-direction peak does not bound it
LINK_FIGURES = ("nvl_gbps", "remote_gbps", "rdma_gbps", "rdma_remote_gbps", "nvl_gbps_p90t", "nvl_gbps_p10t")
ONE_RANK_NOTE = "one rank: nothing crossed a link, so no link bandwidth, link peak or bound is shown"


def measured_fraction(r: dict[str, Any]) -> float | None:
    """nvl_remote against the most this machine moved to other ranks at the start of the run (the larger of
    its all_to_all_single and its exchange with every peer at once: moelab.measure.peaks); dispatch and
    combine only."""
    if r["op"] not in FLAGGED_OPS:
        return None
    return fraction_of_peak(r["remote_gbps"], r.get("measured_remote_peak_gbps"))


def single_rank(r: dict[str, Any]) -> bool:
    return r.get("world") == 1


def drop_link_figures(results: list[dict[str, Any]]) -> None:
    """With one rank nothing crosses a link: its bandwidths (its own rows, copied in place) and its link
    figures are not shown anywhere, so they are removed from the row once, here."""
    for r in results:
        if single_rank(r):
            for key in (*LINK_FIGURES, "measured_remote_peak_gbps", "measured_peer_peak_gbps"):
                r[key] = None


def nodes_panel(environment: Sequence[dict[str, Any]], links: JobLinks) -> list[dict[str, Any]]:
    """One row per (run, node): what the ranks there recorded, library versions merged over backends, and
    the link peak its machine reported (hardware.job_links)."""
    grouped: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in environment:
        grouped[(e["run_id"], e["node"])].append(e)
    out = []
    for (run_id, node), rows in grouped.items():
        first = rows[0]
        libs: dict[str, set[str]] = defaultdict(set)
        for r in rows:
            for k, v in (r["library_versions"] or {}).items():
                libs[str(k)].add(str(v))
        peak = links.get(run_id, first["backend"])

        def distinct(key: str, rows: list[dict[str, Any]] = rows) -> str:
            return ", ".join(sorted({str(r[key]) for r in rows if r[key] is not None})) or ""

        out.append(
            {
                "run_id": run_id,
                "node": node,
                "hosts": distinct("host"),
                "gpu_name": distinct("gpu_name") or "CPU",
                "gpu_count": first["gpu_count"],
                "sm_count": first["sm_count"],
                "driver": distinct("driver"),
                "cuda": distinct("cuda"),
                "nccl": distinct("nccl"),
                "torch": distinct("torch"),
                "python": distinct("python"),
                "backends": distinct("backend"),
                "ranks": len({r["rank"] for r in rows}),
                "libraries": sorted((k, " / ".join(sorted(v))) for k, v in libs.items()),
                "peak_link": peak.link if peak else None,
                "peak_gbps": peak.gbps if peak else None,
                "peak_basis": hardware.basis(peak),
                "peak_source": peak.source if peak else None,
            }
        )
    return out


def annotate_results(results: list[dict[str, Any]], links: JobLinks) -> None:
    """Add each row's link peak (what its machine reported), its fractions of that peak and whether it is
    above it. A one-rank row gets none of them (drop_link_figures)."""
    drop_link_figures(results)
    for r in results:
        peak = None if single_rank(r) else links.get(r["run_id"], r["backend"])
        r["peak_gbps"] = peak.gbps if peak else None
        r["peak_link"] = peak.link if peak else None
        r["peak_basis"] = hardware.basis(peak)
        bounded = r["op"] in FLAGGED_OPS
        r["frac_recv"] = fraction_of_peak(r["nvl_gbps"], r["peak_gbps"]) if bounded else None
        r["frac_remote"] = fraction_of_peak(r["remote_gbps"], r["peak_gbps"]) if bounded else None
        r["frac_remote_measured"] = measured_fraction(r)
        r["above_peak"] = None
        if r["frac_remote"] is not None and r["frac_remote"] > 1:
            r["above_peak"] = "remote above peak"
        elif r["frac_recv"] is not None and r["frac_recv"] > 1:
            r["above_peak"] = "local traffic counted"


def series_name(r: dict[str, Any]) -> str:
    knobs = r["knobs"] or {}
    extra = "".join(f" {k}={v}" for k, v in sorted(knobs.items()))
    return f"{r['backend']} {r['dtype']}{extra}"


def workload_text(r: dict[str, Any], with_tokens: bool = True) -> str:
    tokens = f", {r['tokens_per_rank']} tokens/rank" if with_tokens else ""
    return f"hidden {r['hidden']}{tokens}, topk {r['topk']}, {r['experts_per_rank']} experts/rank, {r['routing']} s{r['routing_seed']}, {r['world']} ranks"


def _common_peak(rows: Sequence[dict[str, Any]]) -> tuple[float, str] | None:
    found = {(r["peak_gbps"], r["peak_link"]) for r in rows if r["peak_gbps"] is not None}
    if len(found) != 1:
        return None
    gbps, link = found.pop()
    return gbps, f"link peak {gbps:.0f} GB/s ({link})"


SWEEP_KEY = (
    "op",
    "run_id",
    "hidden",
    "tokens_per_rank",
    "topk",
    "experts_per_rank",
    "routing",
    "routing_seed",
    "world",
)


def _groups(
    results: Sequence[dict[str, Any]], fields: Sequence[str], keep: str
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows with a value in `keep`, grouped by `fields` (op and run first), in first-seen order."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r[keep] is not None:
            groups[tuple(r[f] for f in fields)].append(r)
    return groups


def _chart(chart_ids: list[int], kind: str, op: str, title: str, svg: str) -> dict[str, Any]:
    chart_ids.append(len(chart_ids) + 1)
    return {"id": f"chart-{chart_ids[-1]}", "kind": kind, "op": op, "title": title, "svg": svg}


def _sm_series(
    op: str, run_id: str, name: str, srows: list[dict[str, Any]], knees: list[dict[str, Any]]
) -> charts.Series:
    """One backend variant's line of an SM chart (sorted by SMs), its knee appended to `knees` where found.
    Drawn in nvl_remote (rows from other ranks), the bytes a per-direction link peak bounds: the chart's
    peak line and the knee's % peak read as the results' % peak does."""
    k = knee([(r["sms"], r["remote_gbps"]) for r in srows])
    marks: tuple[tuple[float, float, str], ...] = ()
    if k is not None:
        peak = srows[0]["peak_gbps"]
        frac = fraction_of_peak(k.best_gbps, peak) if op in FLAGGED_OPS else None
        knees.append(
            {
                "op": op,
                "run_id": run_id,
                "series": name,
                "workload": workload_text(srows[0]),
                "sms": k.sms,
                "gbps": k.gbps,
                "best_sms": k.best_sms,
                "best_gbps": k.best_gbps,
                "frac_peak": frac,
            }
        )
        marks = ((k.sms, k.gbps, f"knee {k.sms} SMs"),)
    return charts.Series(
        xs=[r["sms"] for r in srows],
        ys=[r["remote_gbps"] for r in srows],
        lo=[_scaled(r, "p90_us") for r in srows],
        hi=[_scaled(r, "p10_us") for r in srows],
        marks=marks,
    )


def _scaled(r: dict[str, Any], time_key: str) -> float:
    """nvl_remote at another time of the same op (the band's p10 / p90 edge; the median's without one)."""
    t = r.get(time_key)
    return float(r["remote_gbps"] * r["median_us"] / t) if t else float(r["remote_gbps"])


def sm_sweeps(
    results: Sequence[dict[str, Any]], chart_ids: list[int], draw: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per op and workload with two or more SM counts: a chart (one line per backend variant, band p10-p90)
    and the knee of each line. Returns (charts, knees)."""
    with_sms = [r for r in results if r["sms"] is not None]
    out_charts: list[dict[str, Any]] = []
    knees: list[dict[str, Any]] = []
    for (op, run_id, *_), rows in _groups(with_sms, SWEEP_KEY, keep="remote_gbps").items():
        by_series: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_series[series_name(r)].append(r)
        series = {}
        for name, srows in sorted(by_series.items()):
            srows.sort(key=lambda r: r["sms"])
            if len({r["sms"] for r in srows}) >= 2:
                series[name] = _sm_series(op, run_id, name, srows, knees)
        if not series:
            continue
        hline = _common_peak(rows) if op in FLAGGED_OPS else None
        title = f"{op}: bandwidth vs SMs"
        svg = (
            charts.line_chart(series, title, "SMs", "nvl_remote GB/s (band: p10-p90 time)", hline=hline)
            if draw
            else ""
        )
        out_charts.append(
            _chart(chart_ids, "sm", op, f"{op}: SMs vs bandwidth, {workload_text(rows[0])}", svg)
        )
    return out_charts, knees


def _token_fit(
    op: str, run_id: str, name: str, sms: int | None, srows: list[dict[str, Any]]
) -> dict[str, Any]:
    fit = fit_alpha_beta([r["nvl_bytes"] for r in srows], [r["median_us"] for r in srows])
    return {
        "op": op,
        "run_id": run_id,
        "series": name,
        "sms": "default" if sms is None else sms,
        "workload": workload_text(srows[0], with_tokens=False),
        "n": fit.n,
        "alpha_us": fit.alpha_us,
        "beta_gbps": fit.beta_gbps,
        "r2": fit.r2,
        "withheld": fit.withheld,
    }


def _token_series(srows: list[dict[str, Any]], fit: dict[str, Any]) -> tuple[charts.Series, charts.Series]:
    """(bandwidth, latency) lines of one backend variant against tokens per rank; the latency line carries the
    alpha/beta fit where there is one."""
    xs = [r["tokens_per_rank"] for r in srows]
    alpha, beta = fit["alpha_us"], fit["beta_gbps"]
    fit_ys = [alpha + r["nvl_bytes"] / (beta * 1e3) for r in srows] if alpha is not None and beta else None
    bw = charts.Series(
        xs=xs,
        ys=[r["nvl_gbps"] for r in srows],
        lo=[r["nvl_gbps_p90t"] for r in srows],
        hi=[r["nvl_gbps_p10t"] for r in srows],
    )
    lat = charts.Series(
        xs=xs,
        ys=[r["median_us"] for r in srows],
        lo=[r["p10_us"] for r in srows],
        hi=[r["p90_us"] for r in srows],
        fit_ys=fit_ys,
    )
    return bw, lat


def token_sweeps(
    results: Sequence[dict[str, Any]], chart_ids: list[int], draw: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per op and workload-without-tokens with two or more token counts: the alpha/beta fit of each backend
    variant at each SM count, and one chart (bandwidth and latency against tokens per rank) at the SM
    setting measured most (the library default first). Returns (charts, fits)."""
    key_fields = [f for f in SWEEP_KEY if f != "tokens_per_rank"]
    out_charts: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    for (op, run_id, *_), rows in _groups(results, key_fields, keep="nvl_bytes").items():
        by_series: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_series[(series_name(r), r["sms"])].append(r)
        swept = {k: v for k, v in by_series.items() if len({r["tokens_per_rank"] for r in v}) >= 2}
        if not swept:
            continue
        chart_sms = max(
            {k[1] for k in swept},
            key=lambda s: (s is None, sum(len(v) for k, v in swept.items() if k[1] == s), s or 0),
        )
        bw_series, lat_series = {}, {}
        for (name, sms), srows in sorted(
            swept.items(), key=lambda kv: (kv[0][0], kv[0][1] is not None, kv[0][1] or 0)
        ):
            srows.sort(key=lambda r: r["tokens_per_rank"])
            fits.append(_token_fit(op, run_id, name, sms, srows))
            if sms == chart_sms:
                bw_series[name], lat_series[name] = _token_series(srows, fits[-1])
        text = f"{workload_text(rows[0], with_tokens=False)}, SMs {'default' if chart_sms is None else chart_sms}"
        hline = _common_peak(rows) if op in FLAGGED_OPS else None
        axes = ("nvl_recv GB/s (band: p10-p90 time)", "median µs (dashed: alpha/beta fit)")
        svg = (
            charts.pair_chart(
                bw_series,
                lat_series,
                f"{op} vs tokens per rank",
                "tokens per rank",
                axes,
                hline=hline,
                logx=True,
            )
            if draw
            else ""
        )
        title = f"{op}: bandwidth and latency vs tokens per rank, {text}"
        out_charts.append(_chart(chart_ids, "tokens", op, title, svg))
    return out_charts, fits


def fallback_bars(
    results: Sequence[dict[str, Any]], chart_ids: list[int], draw: bool = True
) -> list[dict[str, Any]]:
    """Without any sweep, one bar per case for each op measured in two or more cases (a chart of one bar
    says nothing the summary does not)."""
    out = []
    for op in OPS:
        rows = [r for r in results if r["op"] == op and r["nvl_gbps"] is not None]
        if len(rows) < 2:
            continue
        labels = [
            f"{series_name(r)} h{r['hidden']} t{r['tokens_per_rank']} sm={r['sms'] or 'default'}"
            for r in rows
        ]
        vline = _common_peak(rows) if op in FLAGGED_OPS else None
        svg = (
            ""
            if not draw
            else charts.bar_chart(
                labels,
                [r["nvl_gbps"] for r in rows],
                f"{op}: bandwidth per case",
                "nvl_recv GB/s",
                vline=vline,
            )
        )
        chart_ids.append(len(chart_ids) + 1)
        out.append(
            {
                "id": f"chart-{chart_ids[-1]}",
                "kind": "bars",
                "op": op,
                "title": f"{op}: bandwidth per case",
                "svg": svg,
            }
        )
    return out


def trace_links(traces: Sequence[dict[str, Any]], base: Path | None) -> list[dict[str, Any]]:
    """Trace paths are stored relative to their run directory; links are made relative to the report."""
    out = []
    for t in traces:
        target = Path(t["run_dir"] or ".") / t["path"]
        href = os.path.relpath(target, base) if base is not None else str(target)
        out.append(t | {"href": Path(href).as_posix()})
    return out
