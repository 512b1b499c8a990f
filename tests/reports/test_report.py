"""Report structure against a fixture database built from synthetic run directories (no torch processes):
every section present, knees and fits with known answers, link-peak flags, escaping of hostile strings."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from moelab.core.errors import MoelabError
from moelab.model.links import load_peaks
from moelab.reports.analysis import fit_alpha_beta, knee
from moelab.reports.html import write_report
from tests.report_fixture import HOSTILE, build_report_db

SECTIONS = (
    "summary",
    "flags",
    "results",
    "sm-sweeps",
    "token-sweeps",
    "compare",
    "environment",
    "correctness",
    "traces",
    "case-metrics",
    "definitions",
)


class _Structure(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.scripts = 0
        self.svgs = 0
        self.chart_ids: list[str] = []
        self.links: list[str] = []
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id") or "")
        if tag == "script":
            self.scripts += 1
        if tag == "svg":
            self.svgs += 1
        if tag == "div" and a.get("class") == "svg":
            self.chart_ids.append(a.get("id") or "")
        if tag == "a" and (a.get("href") or "").endswith(".json"):
            self.links.append(a["href"] or "")
        self.handlers += [k for k in a if k.startswith("on")]


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return build_report_db(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def html_report(fixture_db: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("out") / "report.html"
    write_report(fixture_db[0], None, out)
    return out.read_text(), out


def test_sections_and_charts(html_report: tuple[str, Path]) -> None:
    text, _ = html_report
    p = _Structure()
    p.feed(text)
    assert p.sections == list(SECTIONS)
    # 3 ops x 3 token counts of SM sweeps, 3 ops of token sweeps; each chart one inline SVG
    assert len(p.chart_ids) == 12 and p.svgs == 12
    assert p.chart_ids == [f"chart-{i}" for i in range(1, 13)]
    assert p.scripts == 0 and p.handlers == []
    assert "mathdefault" not in text  # tick labels drawn as plain text (mathtext is off for hostile names)
    assert "default-src 'none'" in text  # CSP: no script can run even if one got in
    assert (
        not re.search(r'(src|href)="(https?:)?//', text) and "<link" not in text and "@import" not in text
    )  # opens offline


def test_knees_fits_and_peaks(html_report: tuple[str, Path]) -> None:
    text, _ = html_report
    knees = re.search(r'<h3 id="knees">(.*?)</table>', text, re.S)
    assert knees and knees.group(1).count("<tr>") == 1 + 18  # header + 3 ops x 3 workloads x 2 backends
    fits = re.search(r"Fit: latency(.*?)</table>", text, re.S)
    assert fits and fits.group(1).count("<tr>") == 1 + 18  # 3 ops x 3 SM counts x 2 backends
    # the fixture stored no NVML reading: the datasheet figure, labelled as the fallback it is
    assert "478.1 GB/s (NVLink4 18 x 26.56 GB/s; datasheet)" in text
    # deepep at 2048 tokens, 16+ SMs: nvl_recv above 478 GB/s while nvl_remote is half of it: one group
    assert text.count("nvl_recv above the link peak (local rows counted)") == 1 and "DeepEP#633" in text
    assert "local &gt; peak" in text and "nvl_remote above the link peak" not in text
    for name in ("nvl_recv", "nvl_remote"):
        assert f"<dt>{name}</dt>" in text


def test_health_traces_metrics_and_flags(html_report: tuple[str, Path]) -> None:
    text, out = html_report
    p = _Structure()
    p.feed(text)
    assert len(p.links) == 1 and not p.links[0].startswith("/")
    assert (out.parent / p.links[0]).resolve().name.endswith(".rank0.json")
    assert "layer_time" in text and "812.5" in text
    assert 'class="l warn">warn</td>' in text
    assert "spread too wide" in text and ">suspect</summary>" in text  # the badge opens on its reason


def test_hostile_strings_are_escaped(
    html_report: tuple[str, Path], tmp_path: Path, fixture_db: tuple[Path, str]
) -> None:
    text, _ = html_report
    assert HOSTILE not in text
    assert "<script>" not in text and "<img" not in text
    escaped = "&lt;script&gt;document.title=&#39;PWNED&#39;&lt;/script&gt;"
    assert (
        text.count(escaped) >= 5
    )  # host, label, library version, health reason, suspect reason, metric definition
    md_path = tmp_path / "r.md"
    write_report(fixture_db[0], None, md_path, "md")
    md = md_path.read_text()
    assert "<script>" not in md and "&lt;script&gt;" in md


def test_markdown_structure(fixture_db: tuple[Path, str], tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    write_report(fixture_db[0], None, out, "md")
    md = out.read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    widths = {ln.count(" | ") for ln in rows if not ln.startswith("|---")}
    assert md.startswith("# moelab report")
    # summary (3 ops x 3 workloads), results, knees, fits, case metrics
    assert len(rows) == (1 + 9) + (1 + 2 * 9 * 3) + (1 + 18) + (1 + 18) + (1 + 1)
    assert md.index("## Summary") < md.index("## Flags") < md.index("## Results")
    assert "| nccl-a2a | h4096-t128-k8-e8-uniform-s0-bf16-sm8 | dispatch | 8 |" in md
    assert len(widths) >= 1 and all(w > 3 for w in widths)
    assert "**nvl_recv above the link peak (local rows counted)**" in md and "local > peak" in md


def test_unknown_run_and_format_are_user_errors(fixture_db: tuple[Path, str], tmp_path: Path) -> None:
    with pytest.raises(MoelabError, match="no such run"):
        write_report(fixture_db[0], ["nope"], tmp_path / "x.html")
    with pytest.raises(MoelabError, match="unknown report format"):
        write_report(fixture_db[0], None, tmp_path / "x.pdf", "pdf")


def test_knee_and_fit_known_answers() -> None:
    k = knee([(8, 100.0), (16, 190.0), (24, 198.0), (32, 200.0)])
    assert k is not None and (k.sms, k.best_sms) == (16, 32)
    assert knee([(8, 1.0)]) is None
    f = fit_alpha_beta([1e6, 2e6, 4e6, 8e6], [20 + b / 200e3 for b in (1e6, 2e6, 4e6, 8e6)])
    assert f.shown and f.alpha_us == pytest.approx(20) and f.beta_gbps == pytest.approx(200)
    noisy = fit_alpha_beta([1e6, 2e6, 4e6, 8e6], [10, 60, 15, 70])
    assert not noisy.shown and noisy.beta_gbps is None and "R²" in (noisy.withheld or "")


def test_peaks_table_and_override(tmp_path: Path) -> None:
    peaks = load_peaks(None)
    assert peaks.gpu("NVIDIA H200").gbps == pytest.approx(478.08)  # type: ignore[union-attr]
    assert peaks.gpu("NVIDIA H100 PCIe").link.startswith("PCIe Gen5")  # type: ignore[union-attr]
    assert peaks.gpu("NVIDIA B200").gbps == 900  # type: ignore[union-attr]
    assert peaks.gpu("NVIDIA A100-SXM4-80GB").gbps == 300  # type: ignore[union-attr]
    assert peaks.nic("Mellanox ConnectX-7").gbps == 50  # type: ignore[union-attr]
    assert peaks.gpu(None) is None and peaks.gpu("Tesla T4") is None
    f = tmp_path / "peaks.toml"
    f.write_text('[gpu."H200"]\nlink = "lab NVLink"\ngbps = 400\n[gpu."T4"]\ngbps = 16\n')
    custom = load_peaks(f)
    assert custom.gpu("NVIDIA H200").gbps == 400 and custom.gpu("Tesla T4").gbps == 16  # type: ignore[union-attr]
    f.write_text('[gpu."X"]\nlink = "no number"\n')
    with pytest.raises(MoelabError, match="gbps"):
        load_peaks(f)
