"""The answer first: per op, payload type and workload, the backends ranked with the interval that makes
the ranking honest, the knee in SMs, how close the fastest got to the measured link peak and to moelab
model's bound, the verdict against a baseline, and the flagged cases counted by kind.

The ranking is the one rule `moelab compare` uses (moelab.core.ranking): each backend against the fastest
by the 99% interval of their time ratio over processes (--repeat), a winner only where it excludes 1; a
backend without two processes a side has no interval and is never beaten or a winner ("no interval").
Each entry shows its own median with its ~95% interval (`Estimate`, `interval(row)`): over the processes
with repeats, else the op's stored `noise` within its one process, which ranks nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moelab.core import ranking
from moelab.core.e2e_spec import BENCH_E2E, LAYER_NAME, LAYER_OPS, bench_of
from moelab.model.above import above_findings
from moelab.reports.sections import ONE_RANK_NOTE, series_name, workload_text

ProcessMedians = Mapping[tuple[str, str, str, str], tuple[list[float], list[float]]]

UNSTABLE_MARK, SUSPECT_MARK, CONTENDED_MARK = "~", "!", "#"
LEGEND = (
    f"{UNSTABLE_MARK} unstable median (noise above target, more than one mode, ranks differ or moved between "
    f"runs); {SUSPECT_MARK} suspect case (machine shared, health worsened or spread too wide); "
    f"{CONTENDED_MARK} contended (measured while it ran: host load, other runs, health)"
)
VERDICT_ORDER = (
    "broken",
    "regression",
    "invalid",
    "underpowered",
    "contended",
    "improvement",
    "noise",
    "inconclusive",
    "unchanged",
    "missing",
    "new",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """An op's median time and the interval around it (µs)."""

    median_us: float
    low_us: float
    high_us: float
    known: bool = True  # False: no interval was stored, the median stands alone

    @property
    def half_width(self) -> float:
        """Relative half-width of the interval: 0.02 reads ±2%."""
        return (self.high_us - self.low_us) / 2 / self.median_us if self.median_us else 0.0

    def overlaps(self, other: Estimate) -> bool:
        return self.low_us <= other.high_us and other.low_us <= self.high_us


def interval(r: Mapping[str, Any]) -> Estimate | None:
    """The ~95% interval of a stored op's median: over its processes where it has several (--repeat), else
    median x (1 ± noise); a point when no noise was stored."""
    median = r.get("median_us")
    if median is None:
        return None
    low, high = r.get("ci_low_us"), r.get("ci_high_us")
    if (r.get("repeats") or 1) > 1 and low is not None and high is not None:
        return Estimate(median_us=median, low_us=low, high_us=high)
    noise = r.get("noise")
    if noise is None:
        return Estimate(median_us=median, low_us=median, high_us=median, known=False)
    return Estimate(median_us=median, low_us=median * (1 - noise), high_us=median * (1 + noise))


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranked:
    name: str
    estimate: Estimate
    tie: bool  # not told from the fastest: the interval covers equality, or there is none
    verdict: str = ""  # against the fastest (ranking.rank_pair); "" for the fastest itself


def rank(
    estimates: Mapping[str, Estimate], processes: Mapping[str, tuple[Sequence[float], bool]] | None = None
) -> list[Ranked]:
    """Fastest median first; each other one against it by ranking.rank_pair on `processes` (name ->
    (per-process medians, run id)), a `tie` unless it is a winner."""
    ordered = sorted(estimates.items(), key=lambda kv: (kv[1].median_us, kv[0]))
    if not ordered:
        return []
    procs = processes or {}
    first_meds, first_run = procs.get(ordered[0][0], ((), ""))
    out = [Ranked(name=ordered[0][0], estimate=ordered[0][1], tie=False)]
    for name, est in ordered[1:]:
        meds, run = procs.get(name, ((), ""))
        verdict = ranking.rank_pair(first_meds, meds, paired=run == first_run).verdict
        out.append(Ranked(name=name, estimate=est, tie=verdict not in ranking.WINNERS, verdict=verdict))
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """One backend variant's best configuration in a summary row."""

    name: str
    estimate: Estimate
    tie: bool
    sms: str  # its fastest SM setting
    verdict: str = ""  # against the fastest: ranking's faster/slower/indistinguishable/no interval
    knee_sms: int | None
    marks: str  # UNSTABLE_MARK and/or SUSPECT_MARK


@dataclass(kw_only=True, slots=True)
class SummaryRow:
    op: str
    dtype: str
    workload: str
    world: int
    entries: list[Entry]
    frac_measured: float | None  # the fastest's nvl_remote over the run's measured all-to-all peak
    frac_bound: float | None  # moelab model's bound over the fastest's median time
    baseline: str | None  # the verdicts of the row's ops against the baseline, counted
    flagged: dict[str, int] = field(
        default_factory=dict
    )  # kind -> ops (unstable, above peak) or cases (suspect)

    @property
    def answer(self) -> str:
        """Who is fastest, in words: one name, or the names the intervals cannot separate."""
        if len(self.entries) == 1:
            return f"{self.entries[0].name} (only one)"
        tied = [e.name for e in self.entries if e.tie]
        if any(e.verdict == ranking.NO_INTERVAL for e in self.entries if e.tie):
            return f"{', '.join([self.entries[0].name, *tied])}: no interval to rank them (--repeat 3)"
        if tied:
            return f"{', '.join([self.entries[0].name, *tied])}: indistinguishable"
        return f"{self.entries[0].name} fastest"

    @property
    def one_rank(self) -> bool:
        return self.world == 1


def marks(r: Mapping[str, Any]) -> str:
    """The marks of one result row, in every table that shows it (run, report, compare)."""
    return (
        (UNSTABLE_MARK if r.get("stability") else "")
        + (SUSPECT_MARK if r.get("suspect") else "")
        + (CONTENDED_MARK if r.get("contended") else "")
    )


def group_workload(r: Mapping[str, Any]) -> str:
    return (
        f"h{r['hidden']} t{r['tokens_per_rank']} k{r['topk']} e{r['experts_per_rank']} {r['routing']} "
        f"s{r['routing_seed']}, {r['world']} rank{'s' if r['world'] != 1 else ''}"
    )


def _flag_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    counts["unstable"] = sum(1 for r in rows if r.get("stability"))
    counts["suspect"] = len({(r["run_id"], r["backend"], r["case_id"]) for r in rows if r.get("suspect")})
    counts["above peak"] = sum(1 for r in rows if r.get("above_peak") and not above_findings(r))
    counts["above 100%"] = sum(1 for r in rows if above_findings(r))
    return {k: v for k, v in counts.items() if v}


def _baseline_text(
    rows: Sequence[dict[str, Any]], verdicts: Mapping[tuple[str, str, str, str], str]
) -> str | None:
    found = Counter(
        v for r in rows if (v := verdicts.get((r["run_id"], r["backend"], r["case_id"], r["op"]))) is not None
    )
    if not found:
        return None
    return ", ".join(f"{found[s]} {s}" for s in VERDICT_ORDER if found[s])


def _entry_name(r: Mapping[str, Any], several_runs: bool) -> str:
    knobs = "".join(f" {k}={v}" for k, v in sorted((r.get("knobs") or {}).items()))
    return f"{r['backend']}{knobs}" + (f" ({r['run_id']})" if several_runs else "")


def build(
    results: Sequence[dict[str, Any]],
    knees: Sequence[dict[str, Any]] = (),
    verdicts: Mapping[tuple[str, str, str, str], str] | None = None,
    processes: ProcessMedians | None = None,
) -> list[SummaryRow]:
    """One row per (op, payload, workload) over annotated result rows (sections.annotate_results and
    bounds.annotate_bounds), in the order the rows come (suite order); `processes` (query.process_medians):
    the per-process medians the ranking is on (without them nothing is ranked)."""
    several_runs = len({r["run_id"] for r in results}) > 1
    knee_of = {(k["op"], k["run_id"], k["series"], k["workload"]): k["sms"] for k in knees}
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r.get("median_us") is None:
            continue
        bench = bench_of(r.get("knobs"))
        if bench == BENCH_E2E and r["op"] not in LAYER_OPS:
            continue  # the layer's inner ops are in its own section, not answers
        workload = group_workload(r) + (f", {LAYER_NAME}" if bench == BENCH_E2E else "")
        groups[(r["op"], r["dtype"], workload)].append(r)
    out = []
    for (op, dtype, workload), rows in groups.items():
        best: dict[str, dict[str, Any]] = {}
        for r in rows:
            name = _entry_name(r, several_runs)
            if name not in best or r["median_us"] < best[name]["median_us"]:
                best[name] = r
        estimates = {n: e for n, r in best.items() if (e := interval(r)) is not None}
        meds = {
            n: (
                (processes or {}).get((r["run_id"], r["backend"], r["case_id"], op), ([], []))[0],
                r["run_id"],
            )
            for n, r in best.items()
        }
        entries = []
        for ranked in rank(estimates, meds):
            r = best[ranked.name]
            knee = knee_of.get((op, r["run_id"], series_name(r), workload_text(r)))
            sms = "default" if r["sms"] is None else str(r["sms"])
            entries.append(
                Entry(
                    name=ranked.name,
                    estimate=ranked.estimate,
                    tie=ranked.tie,
                    verdict=ranked.verdict,
                    sms=sms,
                    knee_sms=knee,
                    marks=marks(r),
                )
            )
        top = best[entries[0].name]
        out.append(
            SummaryRow(
                op=op,
                dtype=dtype,
                workload=workload,
                world=top["world"],
                entries=entries,
                frac_measured=top.get("frac_remote_measured"),
                frac_bound=top.get("frac_bound"),
                baseline=_baseline_text(rows, verdicts or {}),
                flagged=_flag_counts(rows),
            )
        )
    return out


def by_workload(rows: Sequence[SummaryRow]) -> list[tuple[str, list[SummaryRow]]]:
    """The rows under one heading per workload, in the order the workloads first come."""
    grouped: dict[str, list[SummaryRow]] = {}
    for r in rows:
        grouped.setdefault(r.workload, []).append(r)
    return list(grouped.items())


def notes(rows: Sequence[SummaryRow]) -> list[str]:
    """Lines said once under the summary."""
    out = []
    if any(r.one_rank for r in rows):
        out.append(ONE_RANK_NOTE)
    return out
