"""Side-by-side comparison of measured cases grouped by one key (backend, GPU model, a software version,
label or run), matched on the workload and SM count.

Bandwidth is also given as a fraction of each group's own link peak (`% peak`: nvl_remote, the rows from
other ranks, over the per-direction peak, whatever `--metric` the GB/s column shows) (moelab.reports.hardware: what each
run's machine reported, the datasheet of its GPU where it stored no reading), so hardware generations compare by how much of their link they use, not only by GB/s, and
as a fraction of moelab model's bound for the case's own topology (`% bound`, moelab.reports.bounds).
When several runs give the same group the same case, the newest run's number is used.

Every ratio comes with its interval over processes (each start of a job under --repeat is one; see
moelab.core.intervals): paired by start where both sides ran in the same run (the k-th starts of two
backends ran in the same rotation), independent otherwise; a run of one start has none. Beside it, a
verdict in time: "indistinguishable" where the interval covers 1; a ranking ("faster", "slower") only where
the slowest rank's times and the fastest rank's times agree on it (CollectiveX's rule: a backend that is
faster only on its slowest rank, or only on its fastest, is not ranked, and the verdict says which).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from moelab.core import ranking
from moelab.core.e2e_spec import BENCH_E2E, LAYER_NAME, bench_of
from moelab.core.errors import MoelabError
from moelab.core.intervals import Interval
from moelab.model.above import above_findings
from moelab.reports import hardware
from moelab.reports.analysis import fraction_of_peak
from moelab.reports.hardware import JobLinks
from moelab.reports.summary import LEGEND, marks

ProcessMedians = dict[tuple[str, str, str, str], tuple[list[float], list[float]]]
INTERVAL_NOTE = (
    "ratios: GB/s over the reference's, with a 99% interval over processes (t on log per-process medians) "
    "where both ran each job more than once (moelab run --repeat 3); X vs ref: in time, a winner only where "
    "the interval excludes 1 and the slowest and the fastest rank agree, 'no interval' is never one; marks: "
    + LEGEND
)

BY_KEYS = ("backend", "gpu", "nccl", "driver", "torch", "label", "run")
METRICS = {"nvl_recv": "nvl_gbps", "nvl_remote": "remote_gbps"}
WORKLOAD_FIELDS = (
    "hidden",
    "tokens_per_rank",
    "topk",
    "experts_per_rank",
    "routing",
    "routing_seed",
    "dtype",
    "world",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    run_id: str
    median_us: float
    gbps: float | None
    frac_peak: float | None
    gpu_name: str | None
    frac_bound: float | None = (
        None  # moelab model's bound time over the measured time (moelab.reports.bounds)
    )
    marks: str = ""  # unstable, suspect, contended (reports.summary.marks)
    slowest: tuple[float, ...] = ()  # per start of the job: the median of the slowest rank's times
    findings: tuple[str, ...] = ()  # each figure above 100% of its bound or peak, with its cause
    fastest: tuple[float, ...] = ()  # ... and of the fastest rank's


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranking:
    """One group against the reference, for one case and op, in time (ratio = group / reference)."""

    ratio: float
    interval: Interval | None  # over processes; None with fewer than two a side
    fast_ratio: float | None  # the same ratio of the fastest rank's times
    fast_interval: Interval | None
    verdict: str  # faster, slower, indistinguishable, no interval, or "not ranked: why"


def rank(ref: Cell, other: Cell) -> Ranking | None:
    """`other` against `ref` by the one ranking rule (moelab.core.ranking: a winner only where the 99%
    interval over processes excludes 1, none without an interval), and only where the slowest-rank and the
    fastest-rank ratios agree."""
    if not ref.slowest or not other.slowest:
        return None
    if not _valid_times(ref) or not _valid_times(other):  # as the gate calls them: invalid, never ranked
        return Ranking(
            ratio=math.nan,
            interval=None,
            fast_ratio=None,
            fast_interval=None,
            verdict="not ranked: times not above zero (invalid)",
        )
    paired = ref.run_id == other.run_id and len(ref.slowest) == len(other.slowest)
    slow = ranking.rank_pair(ref.slowest, other.slowest, paired)
    fast = ranking.rank_pair(ref.fastest, other.fastest, paired) if ref.fastest and other.fastest else None
    if not slow.winner:
        verdict = slow.verdict
    elif fast is not None and fast.ratio == fast.ratio and (fast.ratio < 1) != (slow.ratio < 1):
        verdict = "not ranked: ranks disagree"  # faster on one rank's times, slower on the other's
    elif fast is not None and not fast.winner:
        verdict = f"not ranked: fastest rank {fast.verdict}"
    else:
        verdict = slow.verdict
    return Ranking(
        ratio=slow.ratio,
        interval=slow.interval,
        fast_ratio=fast.ratio if fast else None,
        fast_interval=fast.interval if fast else None,
        verdict=verdict,
    )


def _valid_times(cell: Cell) -> bool:
    """Every figure a ranking reads is a time above zero: all-zero samples are what the gate calls invalid
    (NULL, NaN, infinite or not above zero), and a ratio over them ranked such a run "faster"."""
    times = (cell.median_us, *cell.slowest, *cell.fastest)
    return all(isinstance(t, int | float) and math.isfinite(t) and t > 0 for t in times)


@dataclass(kw_only=True, slots=True)
class CompareRow:
    label: str  # the matched case, without the grouping key
    op: str
    sms: int | None
    # an e2e case's row, kept apart by its label when compared by backend: its ops are the layer's
    layer: bool = False
    cells: dict[str, Cell] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class CompareTable:
    by: str
    metric: str
    groups: list[str]
    reference: str
    rows: list[CompareRow]
    notes: list[str] = field(default_factory=list)  # what the table's runs lack (a partial run's starts)

    def ratio(self, row: CompareRow, group: str) -> float | None:
        """Bandwidth of `group` over the reference group's, for the same case."""
        ref, other = row.cells.get(self.reference), row.cells.get(group)
        if ref is None or other is None or ref.gbps is None or other.gbps is None or ref.gbps <= 0:
            return None
        return other.gbps / ref.gbps

    def ranking(self, row: CompareRow, group: str) -> Ranking | None:
        ref, other = row.cells.get(self.reference), row.cells.get(group)
        return rank(ref, other) if ref is not None and other is not None else None

    def ratio_interval(self, row: CompareRow, group: str) -> Interval | None:
        """The interval of the bandwidth ratio: the time ratio's, inverted and scaled by the bytes ratio."""
        bw, r = self.ratio(row, group), self.ranking(row, group)
        if bw is None or r is None or r.interval is None or r.interval.low <= 0:
            return None
        return Interval(bw * r.ratio / r.interval.high, bw * r.ratio / r.interval.low)

    def ratio_text(self, row: CompareRow, group: str) -> str | None:
        """The bandwidth ratio with its interval where there is one: `1.52 [1.41, 1.6]`."""
        bw, ci = self.ratio(row, group), self.ratio_interval(row, group)
        if bw is None:
            return None
        return f"{bw:.3g}" + (f" {ci.text()}" if ci else "")

    def findings(self) -> list[str]:
        """One line per cell with a figure above 100% of its bound or peak (moelab.model.above)."""
        return [
            f"{g} {row.label} {row.op}: {text}"
            for row in self.rows
            for g, cell in row.cells.items()
            for text in cell.findings
        ]

    def marks_text(self, row: CompareRow) -> str:
        """Each group's marks on this row (summary.LEGEND), e.g. `deepep ~; nccl-a2a !#`."""
        return "; ".join(f"{g} {c.marks}" for g in self.groups if (c := row.cells.get(g)) and c.marks)


def _env_index(environment: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(run, backend) -> the lowest rank's fingerprint."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for e in sorted(environment, key=lambda e: (e["rank"] is None, e["rank"])):
        out.setdefault((e["run_id"], e["backend"]), e)
    return out


def _knobs_text(knobs: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(knobs.items()))


def group_value(by: str, row: dict[str, Any], env: dict[str, Any] | None, run: dict[str, Any]) -> str:
    if by == "backend":
        knobs = _knobs_text(row["knobs"])
        return f"{row['backend']} {knobs}" if knobs else row["backend"]
    if by == "gpu":
        return (env or {}).get("gpu_name") or "CPU"
    if by in ("nccl", "driver", "torch"):
        return str((env or {}).get(by) or "none")
    if by == "label":
        return ", ".join(run.get("labels") or []) or run["run_id"]
    return str(row["run_id"])


def case_label(row: dict[str, Any], with_backend: bool) -> str:
    text = (
        f"h{row['hidden']} t{row['tokens_per_rank']} k{row['topk']} e{row['experts_per_rank']} "
        f"{row['routing']} s{row['routing_seed']} {row['dtype']} w{row['world']}"
    )
    if with_backend:
        knobs = _knobs_text(row["knobs"])
        text = f"{row['backend']} {text}" + (f" {knobs}" if knobs else "")
    elif _is_layer(row):
        text += f" {LAYER_NAME}"  # by backend: a layer's ops face other layers', never a standalone dispatch
    return text


def _is_layer(row: dict[str, Any]) -> bool:
    return bench_of(row["knobs"]) == BENCH_E2E


def build(
    results: Sequence[dict[str, Any]],
    environment: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    links: JobLinks,
    by: str,
    metric: str = "nvl_recv",
    reference: str | None = None,
    processes: ProcessMedians | None = None,
) -> CompareTable:
    """The table; `processes` (query.process_medians) gives each cell its per-start medians, for the
    intervals and the rankings (without it, ratios only)."""
    if by not in BY_KEYS:
        raise MoelabError(f"cannot compare by {by!r}: choose one of {', '.join(BY_KEYS)}")
    if metric not in METRICS:
        raise MoelabError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    envs = _env_index(environment)
    run_by_id = {r["run_id"]: r for r in runs}
    order = {r["run_id"]: i for i, r in enumerate(runs)}  # runs come oldest first
    rows: dict[tuple[Any, ...], CompareRow] = {}
    groups: list[str] = []
    for r in sorted(results, key=lambda r: order.get(r["run_id"], -1)):
        env = envs.get((r["run_id"], r["backend"]))
        g = group_value(by, r, env, run_by_id.get(r["run_id"], {"run_id": r["run_id"]}))
        if g not in groups:
            groups.append(g)
        label = case_label(r, with_backend=by != "backend")
        key = (label, r["op"], r["sms"])
        row = rows.setdefault(
            key, CompareRow(label=label, op=r["op"], sms=r["sms"], layer=by == "backend" and _is_layer(r))
        )
        gpu = (env or {}).get("gpu_name")
        peak = links.get(r["run_id"], r["backend"]) if r["world"] != 1 else None
        gbps = r[METRICS[metric]] if r["world"] != 1 else None  # one rank: nothing crossed a link
        # % peak in one definition everywhere: nvl_remote (rows from other ranks) over the per-direction
        # link peak, whichever metric the GB/s column shows
        remote = r["remote_gbps"] if r["world"] != 1 else None
        frac = (
            fraction_of_peak(remote, peak.gbps if peak else None)
            if r["op"] not in ("roundtrip", "pair", "layout")
            else None
        )
        above = above_findings(
            {
                **r,
                "frac_remote": frac,
                "peak_basis": hardware.basis(peak),
                "peak_link": peak.link if peak else None,
            }
        )
        slowest, fastest = (processes or {}).get((r["run_id"], r["backend"], r["case_id"], r["op"]), ([], []))
        row.cells[g] = Cell(
            run_id=r["run_id"],
            median_us=r["median_us"],
            gbps=gbps,
            frac_peak=frac,
            gpu_name=gpu,
            frac_bound=r.get("frac_bound"),
            findings=tuple(f.text() for f in above),
            marks=marks(r),
            slowest=tuple(float(x) for x in slowest if x is not None),
            fastest=tuple(float(x) for x in fastest if x is not None),
        )
    groups.sort()
    if reference is not None and reference not in groups:
        raise MoelabError(
            f"reference {reference!r} is not among the {by} values: {', '.join(groups) or 'none'}"
        )
    matched = [row for row in rows.values() if len(row.cells) > 1 or len(groups) == 1]
    # a group with no matched case is no use as a column, nor as a default reference
    groups = [g for g in groups if g == reference or any(g in row.cells for row in matched)] or groups
    ref = reference or (groups[0] if groups else "")
    groups = [ref] + [g for g in groups if g != ref] if groups else []
    matched.sort(key=lambda row: (row.label, row.op, row.sms is not None, row.sms or 0))
    return CompareTable(by=by, metric=metric, groups=groups, reference=ref, rows=matched)
