"""`moelab report`: one self-contained HTML file (or Markdown) for one or more runs."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import jinja2

from moelab.errors import MoelabError
from moelab.reports import charts
from moelab.store.db import open_db

OPS = ("dispatch", "combine", "pair")


@dataclass(kw_only=True, slots=True)
class ReportData:
    runs: list[dict[str, Any]]
    environment: list[dict[str, Any]]
    results: list[dict[str, Any]]
    not_measured: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    definitions: list[dict[str, Any]]
    charts: list[dict[str, str]] = field(default_factory=list)


def _dicts(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    cols = [d[0] for d in cur.description or []]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def latest_run_ids(con: duckdb.DuckDBPyConnection, n: int = 1) -> list[str]:
    return [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT ?", [n]).fetchall()]


def load(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> ReportData:
    known = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    missing = [r for r in run_ids if r not in known]
    if missing:
        raise MoelabError(f"no such run(s): {', '.join(missing)}")
    con.execute("CREATE OR REPLACE TEMP TABLE _report_ids AS SELECT UNNEST(?::VARCHAR[]) AS run_id", [run_ids])
    runs = _dicts(con.execute("SELECT run_id, created_at, label, suite, status, backends, device, world, gpus_per_node, command, moelab_version, git_sha FROM runs SEMI JOIN _report_ids USING (run_id) ORDER BY created_at"))
    env = _dicts(con.execute(
        """SELECT DISTINCT run_id, backend, node, host, gpu_name, gpu_count, sm_count, driver, cuda, nccl, torch, python,
                  moelab_version, git_sha, CAST(library_versions AS VARCHAR) AS library_versions
           FROM environment SEMI JOIN _report_ids USING (run_id) ORDER BY run_id, backend, node"""))
    results = _dicts(con.execute(
        """WITH bw AS (
               SELECT run_id, backend, case_id, op,
                      max(CASE WHEN definition = 'nvl_recv' THEN gbps END) AS nvl_gbps,
                      max(CASE WHEN definition = 'nvl_remote' THEN gbps END) AS remote_gbps,
                      max(CASE WHEN definition = 'rdma_pairs' THEN gbps END) AS rdma_gbps,
                      max(CASE WHEN definition = 'nvl_recv' THEN bytes_mean END) AS nvl_bytes
               FROM bandwidths GROUP BY ALL)
           SELECT c.run_id, c.backend, c.case_id, c.hidden, c.tokens_per_rank, c.topk, c.experts_per_rank, c.routing,
                  c.dtype, c.sms, c.world, CAST(c.knobs AS VARCHAR) AS knobs, c.dispatch_err, c.combine_err,
                  r.op, r.n, r.median_us, r.p10_us, r.p90_us, r.p99_us, r.rank_spread_us,
                  bw.nvl_gbps, bw.remote_gbps, bw.rdma_gbps, bw.nvl_bytes,
                  bw.nvl_bytes / r.p90_us / 1e3 AS nvl_gbps_p90t, bw.nvl_bytes / r.p10_us / 1e3 AS nvl_gbps_p10t
           FROM cases c JOIN results r USING (run_id, backend, case_id)
           LEFT JOIN bw USING (run_id, backend, case_id, op)
           WHERE c.run_id IN (SELECT run_id FROM _report_ids)
           ORDER BY c.backend, c.hidden, c.dtype, c.sms NULLS FIRST, r.op"""))
    not_measured = _dicts(con.execute("SELECT run_id, backend, case_id, status, reason FROM cases SEMI JOIN _report_ids USING (run_id) WHERE status <> 'ok' ORDER BY backend, case_id"))
    jobs = _dicts(con.execute("SELECT run_id, backend, status, description, duration_s FROM jobs SEMI JOIN _report_ids USING (run_id) ORDER BY run_id, backend"))
    definitions = _dicts(con.execute("SELECT name, text FROM definitions ORDER BY name"))
    data = ReportData(runs=runs, environment=env, results=results, not_measured=not_measured, jobs=jobs, definitions=definitions)
    data.charts = build_charts(results)
    return data


def _series_key(r: dict[str, Any]) -> str:
    knobs = json.loads(r["knobs"] or "{}")
    extra = "".join(f" {k}={v}" for k, v in sorted(knobs.items()))
    return f"{r['backend']} {r['dtype']}{extra}"


def build_charts(results: list[dict[str, Any]]) -> list[dict[str, str]]:
    """SM-vs-bandwidth per op and workload where SMs vary; else bandwidth per case."""
    out = []
    for op in OPS:
        rows = [r for r in results if r["op"] == op and r["nvl_gbps"] is not None]
        if not rows:
            continue
        by_workload: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_workload[(r["hidden"], r["tokens_per_rank"], r["topk"], r["experts_per_rank"], r["routing"], r["world"])].append(r)
        for wl, wrows in by_workload.items():
            swept = [r for r in wrows if r["sms"] is not None]
            label = f"hidden {wl[0]}, {wl[1]} tokens/rank, topk {wl[2]}, {wl[3]} experts/rank, {wl[4]}, {wl[5]} ranks"
            if len({r["sms"] for r in swept}) > 1:
                series: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {}
                for r in sorted(swept, key=lambda r: r["sms"]):
                    xs, ys, lo, hi = series.setdefault(_series_key(r), ([], [], [], []))
                    xs.append(r["sms"])
                    ys.append(r["nvl_gbps"])
                    lo.append(r["nvl_gbps_p90t"])
                    hi.append(r["nvl_gbps_p10t"])
                svg = charts.line_chart(series, f"{op}: bandwidth vs SMs", "SMs", "NVL GB/s (band: p10–p90 time)")  # type: ignore[arg-type]
                out.append({"title": f"{op} — SMs vs bandwidth — {label}", "svg": svg})
            else:
                labels = [f"{_series_key(r)} sm={r['sms'] or 'default'}" for r in wrows]
                svg = charts.bar_chart(labels, [r["nvl_gbps"] for r in wrows], f"{op}: bandwidth per case", "NVL GB/s")
                out.append({"title": f"{op} — bandwidth per case — {label}", "svg": svg})
    return out


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("moelab.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(data: ReportData, fmt: str = "html") -> str:
    if fmt not in ("html", "md"):
        raise MoelabError(f"unknown report format {fmt!r}: choose html or md")
    env = _env()
    if fmt == "md":
        env.autoescape = False
    template = env.get_template("report.html.j2" if fmt == "html" else "report.md.j2")
    return template.render(d=data, fmtnum=_fmtnum)


def _fmtnum(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def write_report(db_path: Path, run_ids: list[str] | None, out: Path, fmt: str = "html") -> Path:
    if not db_path.exists():
        raise MoelabError(f"no database at {db_path}")
    with open_db(db_path, read_only=True) as con:
        ids = run_ids or latest_run_ids(con)
        if not ids:
            raise MoelabError(f"no runs in {db_path}")
        data = load(con, ids)
    text = render(data, fmt)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise MoelabError(f"cannot write report {out}: {exc}") from exc
    return out
