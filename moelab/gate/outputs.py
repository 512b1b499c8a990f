"""The gate's outputs: terminal rows, Markdown for $GITHUB_STEP_SUMMARY, JUnit XML for CI test views."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from moelab.core.display import safe_text
from moelab.gate.decision import FAILING, GateResult, Verdict, matched

COLUMNS = ("status", "case", "op", "baseline µs", "candidate µs", "change", "test", "p", "note")


def _pct(change: float | None) -> str:
    return "—" if change is None else f"{100 * change:+.1f}%"


def rows(result: GateResult, include_unchanged: bool = False) -> list[list[Any]]:
    return [
        [
            v.status,
            v.case,
            v.op or "",
            v.base_median_us,
            v.cand_median_us,
            _pct(v.change),
            v.method or "",
            v.p_value,
            v.note,
        ]
        for v in result.sorted()
        if include_unchanged or v.status != "unchanged"
    ]


def headline(result: GateResult) -> str:
    counts = ", ".join(
        f"{result.count(s)} {s}"
        for s in ("regression", "broken", "improvement", "missing", "new", "noise", "inconclusive")
        if result.count(s)
    )
    verdict = "FAIL" if result.exit_code else "PASS"
    return f"{verdict}: {matched(result)} ops compared, {counts or 'no change'} (threshold {result.policy.threshold:.0%}, Mann-Whitney p < {result.policy.alpha})"


def _md(text: Any) -> str:
    s = safe_text(text)
    return (
        s.replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("\n", " ")
    )


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def markdown(result: GateResult) -> str:
    lines = [
        "## moelab check",
        "",
        f"**{headline(result)}**",
        "",
        f"- baseline: {_md(result.baseline)}",
        f"- candidate: run `{_md(result.candidate_run)}`",
        "- method: a regression is a median time more than the threshold slower and outside the noise "
        "(Mann-Whitney U on per-iteration times at p < 0.002; with few samples, non-overlapping sample ranges)",
        "",
    ]
    shown = [v for v in result.sorted() if v.status != "unchanged"]
    if shown:
        lines += [
            "| status | case | op | baseline µs | candidate µs | change | test | note |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v in shown:
            mark = "❌ " if v.status in FAILING else ""
            lines.append(
                f"| {mark}{v.status} | {_md(v.case)} | {v.op or ''} | {_num(v.base_median_us)} | {_num(v.cand_median_us)} | "
                f"{_pct(v.change)} | {_md(v.method or '')}{'' if v.p_value is None else f' p={v.p_value:.2g}'} | {_md(v.note)} |"
            )
    else:
        lines.append("Every compared op is within the threshold.")
    return "\n".join(lines) + "\n"


def _testcase(v: Verdict, suite: ET.Element, result: GateResult) -> None:
    tc = ET.SubElement(
        suite,
        "testcase",
        classname=f"moelab.{v.case.split(' ', 1)[0]}",
        name=f"{v.case} {v.op or ''}".strip(),
    )
    detail = f"{v.status}: median {_num(v.base_median_us)} -> {_num(v.cand_median_us)} µs ({_pct(v.change)}); {v.method or ''} {v.note}".strip()
    if v.status in FAILING or (v.status == "missing" and result.policy.fail_on_missing):
        ET.SubElement(tc, "failure", message=f"{v.status} {_pct(v.change)}", type=v.status).text = detail
    elif v.status in ("missing", "new", "inconclusive"):
        ET.SubElement(tc, "skipped", message=detail)
    else:
        ET.SubElement(tc, "system-out").text = detail


def junit(result: GateResult) -> str:
    suites = ET.Element("testsuites", name="moelab check")
    suite = ET.SubElement(
        suites, "testsuite", name=f"moelab check {result.candidate_run} vs {result.baseline_run}"
    )
    for v in result.sorted():
        _testcase(v, suite, result)
    tests = len(suite)
    failures = sum(1 for tc in suite if tc.find("failure") is not None)
    skipped = sum(1 for tc in suite if tc.find("skipped") is not None)
    for el in (suites, suite):
        el.set("tests", str(tests))
        el.set("failures", str(failures))
        el.set("errors", "0")
        el.set("skipped", str(skipped))
    ET.indent(suites)
    # XML 1.0 cannot hold control characters at all, escaped or not: a stored label or case id with one
    # would make the file unreadable to CI, so they are written as visible escapes
    return safe_text(ET.tostring(suites, encoding="unicode", xml_declaration=True), keep_newlines=True) + "\n"
