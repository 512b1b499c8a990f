"""Flags grouped by kind and counted: what the report says first about what not to trust.

One group per kind (a failed job, an incorrect case, a health snapshot that is not a pass, an op above
its link peak, a suspect case by the reason it is suspect, an unstable median by the rule it broke), its
explanation said once, then every flagged case once, with the short figure that flagged it. A report with
ten cases that share a reason shows one group of ten, not ten sentences.

Each result row also gets its `badges`: (label, severity, full text), the short marks the results table
shows, whose text opens on hover or click.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from moelab.model.above import PEAK_DEFINITION, TIMING_ARTEFACT, TOPOLOGY_MISMATCH, above_findings

ABOVE_PEAK_NOTE = (
    "nvl_recv counts the rows a rank sends to itself, which never cross NVLink, so it can exceed the link "
    "peak (DeepEP#633); nvl_remote counts only rows from other ranks and is the figure to hold against the peak."
)
ABOVE_EXPLAIN = {
    PEAK_DEFINITION: "the peak is not the capacity of the bytes counted (one neighbour's copy against traffic to "
    "several peers, NCCL's own exchange as the hardware's): the figure says nothing until the peak is fixed",
    TOPOLOGY_MISMATCH: "the bound assumed links this machine does not have: it is no bound for this run",
    TIMING_ARTEFACT: "the bytes cannot cross faster than the link: the time is too short (the slowest rank not "
    "timed, iterations overlapping)",
}
BAD_STATUSES = ("failed", "incorrect", "crashed", "timeout")
NOT_RUN_NOTE = (
    "not run here, by design: the reason says why (`moelab run --list-cases` shows them before a run)"
)


@dataclass(frozen=True, slots=True)
class FlagItem:
    where: str  # the case (backend and case id), job or snapshot
    detail: str  # the figure or reason that flagged it, short


@dataclass(kw_only=True, slots=True)
class FlagGroup:
    kind: str  # stable key: "job", "case:incorrect", "health:fail", "peak:remote", "suspect:spread", ...
    severity: str  # "warn" | "fail"
    title: str
    explain: str
    unit: str = "cases"
    items: list[FlagItem] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.items)


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str
    title: str
    explain: str
    pattern: str  # regex whose first group is the short figure (the whole part when it does not match)


UNSTABLE_RULES = (
    _Rule(
        "noise",
        "unstable: median noise above target",
        "the median's 95% interval stayed wider than the noise target up to the most iterations allowed",
        r"noise ([\d.]+%)",
    ),
    _Rule(
        "modes",
        "unstable: more than one mode",
        "p10-p90 spread so wide the samples hold more than one mode",
        r"spread ([\d.]+%)",
    ),
    _Rule(
        "ranks",
        "unstable: ranks differ",
        "one rank waits on another for a large share of the median",
        r"differ by ([\d.]+%)",
    ),
    _Rule(
        "drift",
        "unstable: moved between runs",
        "the median moved more than 5% from the latest earlier run of the same case on the same machine and "
        "software (GPU runs only)",
        r"median ([+-][\d.]+% from run \S+?)'s",
    ),
)
SUSPECT_RULES = (
    _Rule(
        "host-load",
        "suspect: host busy",
        "host load beyond this run's own ranks while the job ran",
        r"host load ([\d.]+ on \d+ cores)",
    ),
    _Rule(
        "moelab-run",
        "suspect: another moelab run",
        "another moelab run used this host at the same time",
        r"\((.*?)\)",
    ),
    _Rule(
        "gpu-process",
        "suspect: another GPU process",
        "another process used the GPUs while the job ran",
        r"(.*)",
    ),
    _Rule(
        "spread",
        "suspect: spread far above its reference",
        "an op's IQR/median far above the case's own history, or above 3x the 5% noise target (GPU runs)",
        r"(\w+ IQR/median [\d.]+%)",
    ),
    _Rule(
        "drift",
        "suspect: moved between runs",
        "an op's median moved between runs (see unstable)",
        r"drift: (\w+ median [+-][\d.]+%)",
    ),
    _Rule(
        "health",
        "suspect: health worsened during the job",
        "a health snapshot after the job was worse than the one before",
        r"(.*)",
    ),
    _Rule("other", "suspect", "the reason stored with the case", r"(.*)"),
)


def _parts(text: str, kinds: Sequence[str]) -> list[tuple[str, str]]:
    """(kind, part) of a stored reason joined with '; ': a part starting `KIND:` opens a new kind; a part
    without a known prefix continues the one before, or stands alone (health when it says a snapshot
    changed during the run, else other)."""
    out: list[tuple[str, str]] = []
    for part in (p.strip() for p in text.split("; ")):
        if not part:
            continue
        head = part.split(":", 1)[0]
        if head in kinds:
            out.append((head, part))
        elif out and out[-1][0] != "other":
            out[-1] = (out[-1][0], f"{out[-1][1]}; {part}")
        else:
            out.append(("health" if "during the run" in part else "other", part))
    return out


def _stability_parts(text: str) -> list[tuple[str, str]]:
    out = []
    for part in (p.strip() for p in text.split("; ")):
        if not part:
            continue
        kind = next(
            (
                k
                for k, key in (
                    ("drift", "from run"),
                    ("modes", "mode"),
                    ("ranks", "ranks differ"),
                    ("noise", "noise"),
                )
                if key in part
            ),
            "noise",
        )
        out.append((kind, part))
    return out


def _short(rule: _Rule, part: str) -> str:
    found = re.search(rule.pattern, part)
    return found.group(1) if found and found.group(1) else part


def case_where(r: dict[str, Any], several_runs: bool) -> str:
    run = f" ({r['run_id']})" if several_runs else ""
    return f"{r['backend']} {r['case_id']}{run}"


class _Groups:
    """Groups in first-seen order, each case once per group (its details joined)."""

    def __init__(self) -> None:
        self.groups: dict[str, FlagGroup] = {}
        self.items: dict[str, dict[str, list[str]]] = defaultdict(dict)

    def add(
        self, kind: str, severity: str, title: str, explain: str, where: str, detail: str, unit: str = "cases"
    ) -> None:
        if kind not in self.groups:
            self.groups[kind] = FlagGroup(
                kind=kind, severity=severity, title=title, explain=explain, unit=unit
            )
        details = self.items[kind].setdefault(where, [])
        if detail and detail not in details:
            details.append(detail)

    def build(self) -> list[FlagGroup]:
        order = {"fail": 0, "warn": 1}
        out = []
        for kind, g in self.groups.items():
            g.items = [FlagItem(where, ", ".join(d)) for where, d in self.items[kind].items()]
            out.append(g)
        return sorted(out, key=lambda g: order.get(g.severity, 2))


def result_flags(
    results: Iterable[dict[str, Any]], several_runs: bool, into: _Groups | None = None
) -> _Groups:
    """Above-peak, suspect and unstable groups from annotated result rows; sets each row's `badges`."""
    groups = into or _Groups()
    for r in results:
        where, badges = case_where(r, several_runs), []
        for finding in above_findings(r):
            groups.add(
                f"above:{finding.cause}",
                "fail",
                f"above 100% of its bound or peak: {finding.cause}",
                ABOVE_EXPLAIN[finding.cause],
                where,
                f"{r['op']} {finding.figure} {100 * finding.fraction:.0f}%: {finding.why}",
            )
            badges.append((f"{finding.figure} > 100%", "bad", finding.text()))
        if r.get("above_peak") == "local traffic counted":  # remote above the peak: flagged above
            text = f"nvl_recv {r['nvl_gbps']:.1f} GB/s is above the {r['peak_link']} peak {r['peak_gbps']:.0f} GB/s"
            groups.add(
                "peak:local",
                "warn",
                "nvl_recv above the link peak (local rows counted)",
                ABOVE_PEAK_NOTE,
                where,
                f"{r['op']} {r['nvl_gbps']:.0f} GB/s",
            )
            badges.append(("local > peak", "warn", text + ": " + ABOVE_PEAK_NOTE))
        if r.get("suspect"):
            reason = r.get("suspect_reason") or "no reason recorded"
            for kind, part in _parts(reason, [x.kind for x in SUSPECT_RULES]):
                rule = next(x for x in SUSPECT_RULES if x.kind == kind)
                groups.add(f"suspect:{kind}", "warn", rule.title, rule.explain, where, _short(rule, part))
            badges.append(("suspect", "warn", reason))
        if r.get("stability"):
            for kind, part in _stability_parts(r["stability"]):
                rule = next(x for x in UNSTABLE_RULES if x.kind == kind)
                groups.add(
                    f"unstable:{kind}",
                    "warn",
                    rule.title,
                    rule.explain,
                    where,
                    f"{r['op']} {_short(rule, part)}",
                )
            badges.append(("unstable", "warn", r["stability"]))
        if r.get("host_sync"):
            badges.append(("host sync", "info", f"host sync: {r['host_sync']}"))
        r["badges"] = badges
    return groups


def group_flags(
    results: list[dict[str, Any]],
    bad_jobs: Sequence[dict[str, Any]],
    not_measured: Sequence[dict[str, Any]],
    health: Sequence[dict[str, Any]],
    several_runs: bool,
) -> list[FlagGroup]:
    """Every flag of a report, grouped by kind (failures first), each case once per group."""
    groups = _Groups()
    for j in bad_jobs:
        cause = f"; cause: {j['cause']}" if j.get("cause") else ""
        groups.add(
            "job",
            "fail",
            "jobs that did not finish",
            "the job's cases were not measured; each rank's account is under Correctness and health",
            f"{j['backend']} ({j['run_id']})",
            f"{j['status']}: {j['description']}{cause}",
            unit="jobs",
        )
    for c in not_measured:
        cause = f"; cause: {c['cause']}" if c.get("cause") else ""
        where, detail = case_where(c, several_runs), f"{c['reason'] or ''}{cause}"
        if c["status"] in BAD_STATUSES:
            why = "its result differed from the reference" if c["status"] == "incorrect" else "its job failed"
            groups.add(
                f"case:{c['status']}", "fail", f"cases {c['status']}", f"not timed: {why}", where, detail
            )
        else:
            groups.add(f"case:{c['status']}", "info", f"cases {c['status']}", NOT_RUN_NOTE, where, detail)
    for h in health:
        if h["worst"] in ("warn", "fail"):
            found = "; ".join(
                f"{f.get('subject')} {f.get('check')}: {f.get('reason')}" for f in h["findings"]
            )
            groups.add(
                f"health:{h['worst']}",
                "fail" if h["worst"] == "fail" else "warn",
                f"health snapshots: {h['worst']}",
                "moelab doctor's rules on the snapshot taken around the job",
                f"{h['phase']} {h['backend']} on {h['host']}",
                found,
                unit="snapshots",
            )
    result_flags(results, several_runs, groups)
    return groups.build()
