"""`moelab report --history`: how each figure moved over many runs (asv's model: one series per
benchmark over time, steps detected and marked).

A series is one (backend variant, op, workload, SMs): its points are the runs that measured it, each
with the median time and its p10-p90 band, and the bandwidth (band: the bytes over the p90 and p10
times). One chart per series, drawn by svg_chart (thinned to the chart's width), so the report grows
with the number of series, not with runs x series. Steps come from steps.detect_steps on the medians;
labelled runs (`moelab label`) and changes of the GPU, driver, NCCL or torch between consecutive points
are marked on the chart. The rows are read with one SQL query into NumPy columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from moelab.core import steps as step_detect
from moelab.core.errors import MoelabError
from moelab.reports import svg_chart
from moelab.store.db import open_db

ENV_FIELDS = ("gpu_name", "driver", "nccl", "torch")
MAX_MARKER_TEXTS = 12  # per chart; more markers are drawn as lines with a tooltip only
METRICS = ("nvl_recv", "nvl_remote", "rdma_pairs", "rdma_remote", "algbw_send")


@dataclass(frozen=True, kw_only=True, slots=True)
class Filters:
    since: datetime | None = None  # naive UTC, as stored
    labels: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # case-insensitive substrings of the GPU name
    runs: tuple[str, ...] = ()
    metric: str = "nvl_recv"

    def describe(self) -> str:
        parts = []
        if self.since:
            parts.append(f"since {self.since:%Y-%m-%d %H:%M} UTC")
        for name, values in (("label", self.labels), ("backend", self.backends), ("gpu", self.gpus)):
            if values:
                parts.append(f"{name} {' or '.join(values)}")
        if self.runs:
            parts.append(f"{len(self.runs)} given runs")
        return ", ".join(parts) or "all runs"


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """'2026-11-01', '2026-11-01T12:00', or a span back from now: '30d', '12h', '2w'."""
    if text is None:
        return None
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    try:
        m = re.fullmatch(r"\s*(\d+)\s*([hdw])\s*", text)
        if m:
            n, unit = int(m.group(1)), m.group(2)
            return now - {"h": timedelta(hours=n), "d": timedelta(days=n), "w": timedelta(weeks=n)}[unit]
        t = datetime.fromisoformat(text.strip())
        return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t
    except ValueError:
        raise MoelabError(
            f"--since takes a date (2026-11-01), a time (2026-11-01T12:00) or a span (30d, 12h, 2w), got {text!r}"
        ) from None
    except OverflowError:  # a span of 99999999d, or 0001-01-01 east of UTC: before year 1 or after 9999
        raise MoelabError(f"--since {text!r} is outside the calendar (years 1 to 9999)") from None


@dataclass(kw_only=True, slots=True)
class Series:
    ident: int
    backend: str
    variant: str  # backend, dtype and knobs
    op: str
    workload: str
    sms: int | None
    run_ids: np.ndarray
    t: np.ndarray  # epoch seconds
    median_us: np.ndarray
    p10_us: np.ndarray
    p90_us: np.ndarray
    gbps: np.ndarray
    gbps_lo: np.ndarray
    gbps_hi: np.ndarray
    env: list[tuple[Any, ...]]
    steps: list[step_detect.Step] = field(default_factory=list)
    svg: str = ""

    @property
    def title(self) -> str:
        sms = "default SMs" if self.sms is None else f"{self.sms} SMs"
        return f"{self.variant} · {self.op} · {self.workload} · {sms}"

    @property
    def anchor(self) -> str:
        return f"series-{self.ident}"


@dataclass(kw_only=True, slots=True)
class History:
    filters: Filters
    runs: int
    first: datetime | None
    last: datetime | None
    series: list[Series]
    labels: dict[str, list[str]]  # run id -> labels
    metric: str
    x_axis: str

    @property
    def steps(self) -> list[dict[str, Any]]:
        out = []
        for s in self.series:
            for st in s.steps:
                i = st.index
                out.append(
                    {
                        "series": s.title,
                        "anchor": s.anchor,
                        "run_before": str(s.run_ids[i - 1]),
                        "run_after": str(s.run_ids[i]),
                        "when": datetime.fromtimestamp(float(s.t[i]), tz=timezone.utc).strftime(
                            "%Y-%m-%d %H:%M"
                        ),
                        "before_us": st.before,
                        "after_us": st.after,
                        "change": st.change,
                        "verdict": "slower" if st.change > 0 else "faster",
                        "changed": _env_change(s.env[i - 1], s.env[i]),
                    }
                )
        return sorted(out, key=lambda r: (-abs(r["change"]), r["series"]))


def _env_change(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    """What the runs on either side of a step ran on differently (GPU, driver, NCCL, torch), or ''."""
    return "; ".join(
        f"{name} {a} → {b}" for name, a, b in zip(ENV_FIELDS, before, after, strict=True) if a != b
    )


def _query(con: duckdb.DuckDBPyConnection, f: Filters) -> dict[str, np.ndarray]:
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    if f.since is not None:
        where.append("r.created_at >= ?")
        params.append(f.since)
    if f.labels:
        where.append(
            "(r.label IN (SELECT UNNEST(?::VARCHAR[])) OR r.run_id IN "
            "(SELECT run_id FROM labels WHERE label IN (SELECT UNNEST(?::VARCHAR[]))))"
        )
        params += [list(f.labels), list(f.labels)]
    if f.runs:
        where.append("r.run_id IN (SELECT UNNEST(?::VARCHAR[]))")
        params.append(list(f.runs))
    case_where = ["c.status = 'ok'"]
    case_params: list[Any] = []
    if f.backends:
        case_where.append("c.backend IN (SELECT UNNEST(?::VARCHAR[]))")
        case_params.append(list(f.backends))
    if f.gpus:
        case_where.append(
            " OR ".join(["contains(lower(coalesce(e.gpu_name, 'cpu')), lower(?))"] * len(f.gpus))
        )
        case_params += list(f.gpus)
    sql = f"""
        WITH sel AS (SELECT r.run_id, r.created_at FROM runs r WHERE {" AND ".join(where)}),
        env AS (
            SELECT run_id, backend,
                   {", ".join(f"arg_min({c}, coalesce(rank, 2147483647)) AS {c}" for c in ENV_FIELDS)}
            FROM environment WHERE run_id IN (SELECT run_id FROM sel) GROUP BY run_id, backend),
        bw AS (SELECT run_id, backend, case_id, op, gbps, bytes_mean FROM bandwidths
               WHERE definition = ? AND run_id IN (SELECT run_id FROM sel)),
        rows AS (
            SELECT c.backend, coalesce(CAST(c.knobs AS VARCHAR), '{{}}') AS knobs, c.dtype, r.op, c.hidden,
                   c.tokens_per_rank, c.topk, c.experts_per_rank, c.routing, c.routing_seed, c.world,
                   coalesce(c.sms, -1) AS sms, s.run_id, epoch(s.created_at) AS t, r.median_us, r.p10_us, r.p90_us,
                   bw.gbps, bw.bytes_mean / r.p90_us / 1e3 AS gbps_lo, bw.bytes_mean / r.p10_us / 1e3 AS gbps_hi,
                   {", ".join(f"e.{c}" for c in ENV_FIELDS)}
            FROM sel s JOIN cases c USING (run_id) JOIN results r USING (run_id, backend, case_id)
            LEFT JOIN bw USING (run_id, backend, case_id, op) LEFT JOIN env e USING (run_id, backend)
            WHERE {" AND ".join(f"({w})" for w in case_where)} AND r.median_us > 0 AND isfinite(r.median_us))
        SELECT dense_rank() OVER (ORDER BY backend, knobs, dtype, op, hidden, tokens_per_rank, topk,
                                  experts_per_rank, routing, routing_seed, world, sms) AS sid, *
        FROM rows ORDER BY sid, t, run_id"""
    return con.execute(sql, [*params, f.metric, *case_params]).fetchnumpy()


def _knobs_text(knobs: str) -> str:
    import json

    try:
        d = json.loads(knobs) if knobs else {}
    except json.JSONDecodeError:
        return knobs
    return "".join(f" {k}={v}" for k, v in sorted(d.items())) if isinstance(d, dict) else ""


def _col(cols: dict[str, np.ndarray], name: str, a: int, b: int, dtype: Any = np.float64) -> np.ndarray:
    c: Any = cols[name][a:b]
    if np.ma.isMaskedArray(c):  # NULLs: NaN in numbers, None in objects
        c = (
            np.ma.filled(c.astype(dtype), np.nan)
            if dtype is np.float64
            else np.ma.filled(c.astype(object), None)
        )
    return np.asarray(c, dtype=dtype)


def _split(cols: dict[str, np.ndarray]) -> list[Series]:
    sid = np.asarray(cols["sid"])
    if sid.size == 0:
        return []
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    ends = np.r_[starts[1:], sid.size]
    out = []
    for n, (a_, b_) in enumerate(zip(starts, ends, strict=True), start=1):
        a, b = int(a_), int(b_)
        first: dict[str, Any] = {k: (v[a] if not np.ma.is_masked(v[a]) else None) for k, v in cols.items()}
        sms = int(first["sms"])
        out.append(
            Series(
                ident=n,
                backend=str(first["backend"]),
                variant=f"{first['backend']} {first['dtype']}{_knobs_text(str(first['knobs']))}",
                op=str(first["op"]),
                workload=(
                    f"hidden {first['hidden']}, {first['tokens_per_rank']} tokens/rank, topk {first['topk']}, "
                    f"{first['experts_per_rank']} experts/rank, {first['routing']} s{first['routing_seed']}, {first['world']} ranks"
                ),
                sms=None if sms < 0 else sms,
                run_ids=_col(cols, "run_id", a, b, object),
                t=_col(cols, "t", a, b),
                median_us=_col(cols, "median_us", a, b),
                p10_us=_col(cols, "p10_us", a, b),
                p90_us=_col(cols, "p90_us", a, b),
                gbps=_col(cols, "gbps", a, b),
                gbps_lo=_col(cols, "gbps_lo", a, b),
                gbps_hi=_col(cols, "gbps_hi", a, b),
                env=list(zip(*(_col(cols, c, a, b, object) for c in ENV_FIELDS), strict=True)),
            )
        )
    return out


def _env_markers(s: Series, x: np.ndarray) -> list[svg_chart.Marker]:
    out = []
    for i in range(1, len(s.env)):
        before, after = s.env[i - 1], s.env[i]
        if before == after:
            continue
        what = [
            f"{name.replace('gpu_name', 'GPU')} {a or '—'} → {b or '—'}"
            for name, a, b in zip(ENV_FIELDS, before, after, strict=True)
            if a != b
        ]
        out.append(svg_chart.Marker(x=float(x[i]), kind="env", text="; ".join(what), title="; ".join(what)))
    return out


def _markers(s: Series, x: np.ndarray, labels: dict[str, list[str]]) -> list[svg_chart.Marker]:
    marks = [
        svg_chart.Marker(
            x=float(x[st.index])
            if x[st.index] == x[st.index - 1]
            else float((x[st.index] + x[st.index - 1]) / 2),
            kind="slower" if st.change > 0 else "faster",
            text=f"{100 * st.change:+.1f}%",
            title=f"step: median {st.before:.4g} → {st.after:.4g} µs ({100 * st.change:+.1f}%) at run {s.run_ids[st.index]}",
        )
        for st in s.steps
    ]
    for i, run_id in enumerate(s.run_ids):
        for name in labels.get(str(run_id), []):
            marks.append(
                svg_chart.Marker(x=float(x[i]), kind="label", text=name, title=f"label {name}: run {run_id}")
            )
    marks += _env_markers(s, x)
    if len(marks) > MAX_MARKER_TEXTS:  # keep the steps' texts, then as many others as fit
        keep = {id(m) for m in marks[: len(s.steps)]}
        keep |= {id(m) for m in marks[len(s.steps) :][: max(0, MAX_MARKER_TEXTS - len(s.steps))]}
        marks = [
            m if id(m) in keep else svg_chart.Marker(x=m.x, kind=m.kind, text="", title=m.title)
            for m in marks
        ]
    return marks


def load(
    con: duckdb.DuckDBPyConnection, filters: Filters, x_axis: str = "time", draw: bool = True
) -> History:
    if filters.metric not in METRICS:
        raise MoelabError(f"unknown metric {filters.metric!r}: choose one of {', '.join(METRICS)}")
    if x_axis not in ("time", "run"):
        raise MoelabError(f"--x takes time or run, got {x_axis!r}")
    cols = _query(con, filters)
    series = _split(cols)
    run_ids = (
        np.unique(np.asarray(cols["run_id"], dtype=object))
        if len(cols["run_id"])
        else np.zeros(0, dtype=object)
    )
    labels: dict[str, list[str]] = {}
    for label, run_id in con.execute(
        "SELECT label, run_id FROM labels WHERE run_id IN (SELECT UNNEST(?::VARCHAR[])) ORDER BY label",
        [list(map(str, run_ids))],
    ).fetchall():
        labels.setdefault(str(run_id), []).append(str(label))
    # x for run order: the rank of each run's time among all runs shown
    all_t = np.unique(np.asarray(cols["t"], dtype=np.float64)) if len(cols["t"]) else np.zeros(0)
    for s in series:
        s.steps = step_detect.detect_steps(s.median_us)
        if not draw:
            continue
        x = s.t if x_axis == "time" else np.searchsorted(all_t, s.t).astype(np.float64)
        chart = svg_chart.Chart(
            x=x,
            panels=(
                svg_chart.Panel(
                    ylabel=f"{filters.metric} GB/s", y=s.gbps, lo=s.gbps_lo, hi=s.gbps_hi, colour="#2e6da4"
                ),
                svg_chart.Panel(
                    ylabel="median µs (p10–p90)", y=s.median_us, lo=s.p10_us, hi=s.p90_us, colour="#b9770e"
                ),
            ),
            markers=_markers(s, x, labels),
            time_axis=x_axis == "time",
        )
        s.svg = svg_chart.render(chart, s.title)
    ts = np.asarray(cols["t"], dtype=np.float64)
    return History(
        filters=filters,
        runs=int(run_ids.size),
        first=datetime.fromtimestamp(float(ts.min()), tz=timezone.utc) if ts.size else None,
        last=datetime.fromtimestamp(float(ts.max()), tz=timezone.utc) if ts.size else None,
        series=series,
        labels=labels,
        metric=filters.metric,
        x_axis=x_axis,
    )


def write_history(
    db_path: Path, filters: Filters, out: Path, fmt: str = "html", x_axis: str = "time"
) -> Path:
    from moelab.reports.html import render_history

    if not db_path.exists():
        raise MoelabError(f"no database at {db_path}")
    with open_db(db_path, read_only=True) as con:
        history = load(con, filters, x_axis=x_axis, draw=fmt == "html")
    if not history.series:
        raise MoelabError(f"no measured case matches ({filters.describe()}) in {db_path}")
    text = render_history(history, fmt)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise MoelabError(f"cannot write report {out}: {exc}") from exc
    return out
