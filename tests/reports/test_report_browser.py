"""The HTML report in headless Chromium: no console errors, every chart drawn, hostile strings inert.

Needs the Debian `chromium` package; skipped cleanly without it. Three browser runs: the report's DOM and
console; a harness page that reads each chart's box from the report in an iframe; a full-page screenshot
cropped to those boxes, where each chart must show its coloured lines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from moelab.reports.html import write_report
from tests.report_fixture import build_report_db

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
)

WIDTH = 1280
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")

HARNESS = """<!DOCTYPE html><html><head><title>harness</title></head><body style="margin:0">
<iframe id="f" src="REPORT" style="width:WIDTHpx;height:60000px;border:0;display:block"></iframe><pre id="out">pending</pre>
<script>
document.getElementById('f').addEventListener('load', () => {
  const d = document.getElementById('f').contentDocument;
  const boxes = [...d.querySelectorAll('div.svg')].map(e => { const r = e.getBoundingClientRect(); return {id: e.id, x: r.left, y: r.top, w: r.width, h: r.height}; });
  const top = id => Math.round(d.getElementById(id).getBoundingClientRect().top);
  const rows = [...d.querySelectorAll('table.results tr')].slice(1).map(e => e.getBoundingClientRect().height);
  document.getElementById('out').textContent = JSON.stringify({height: Math.ceil(d.body.getBoundingClientRect().bottom) + 40, boxes: boxes,
    width: d.documentElement.scrollWidth, widest: Math.max(...[...d.querySelectorAll('table')].map(t => Math.ceil(t.getBoundingClientRect().right))),
    summary: top('summary'), flags: top('flags'), results: top('results'), open: d.querySelectorAll('details[open]').length,
    groups: d.querySelectorAll('details.flag').length, tallest_row: Math.max(...rows)});
});
</script></body></html>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0",
    ]  # fmt: skip
    return subprocess.run(
        [str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=120, check=False
    )


def console_messages(stderr: str) -> list[str]:
    return [m.group(1) for line in stderr.splitlines() if (m := CONSOLE.search(line))]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    db, _ = build_report_db(root)
    return write_report(db, None, root / "report.html")


def test_console_scanner_sees_errors(tmp_path: Path) -> None:
    """Control: the scanner below does catch an uncaught error on a page."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>throw new Error('boom')</script></body></html>")
    out = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert any("Uncaught" in m and "boom" in m for m in console_messages(out.stderr)), out.stderr[-2000:]


def test_no_console_errors_and_hostile_strings_inert(report: Path, tmp_path: Path) -> None:
    out = _chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", report.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    assert console_messages(out.stderr) == [], "console messages: " + "; ".join(console_messages(out.stderr))
    title = re.search(r"<title>(.*?)</title>", out.stdout, re.S)
    assert title and title.group(1).startswith("moelab report") and "PWNED" not in title.group(1)
    assert "<script>document.title" not in out.stdout and '<img src="x"' not in out.stdout
    assert out.stdout.count("&lt;script&gt;document.title='PWNED'&lt;/script&gt;") >= 5  # shown as text


def test_every_chart_is_drawn(report: Path, tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    harness = tmp_path / "harness.html"
    harness.write_text(HARNESS.replace("REPORT", report.as_uri()).replace("WIDTH", str(WIDTH)))
    out = _chromium(
        tmp_path,
        "--allow-file-access-from-files",
        f"--window-size={WIDTH},800",
        "--virtual-time-budget=5000",
        "--dump-dom",
        harness.as_uri(),
    )
    found = re.search(r'<pre id="out">(.*?)</pre>', out.stdout, re.S)
    assert found and found.group(1) != "pending", out.stderr[-2000:]
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    # the new layout: the answer first, flags grouped and folded, every table inside 1280 px, short rows
    assert layout["width"] <= WIDTH and layout["widest"] <= WIDTH, layout
    assert layout["summary"] < layout["flags"] < layout["results"] and layout["summary"] < 400, layout
    assert layout["groups"] >= 2 and layout["open"] == 0, layout
    assert layout["tallest_row"] < 120, layout  # flags are badges whose text opens on demand
    boxes = layout["boxes"]
    assert len(boxes) == 12 and all(b["w"] > 300 and b["h"] > 150 for b in boxes), boxes
    shot = tmp_path / "page.png"
    height = int(layout["height"]) + 10
    out = _chromium(
        tmp_path,
        "--hide-scrollbars",
        f"--window-size={WIDTH},{height}",
        f"--screenshot={shot}",
        report.as_uri(),
    )
    assert shot.exists(), out.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    assert pixels.shape[0] >= height - 10, f"screenshot {pixels.shape} shorter than the page ({height})"
    chroma = pixels.max(axis=2) - pixels.min(
        axis=2
    )  # coloured: lines, bands, markers; axes and text are grey
    dark = pixels.min(axis=2) < 200
    for b in boxes:
        y0, y1, x0, x1 = int(b["y"]), int(b["y"] + b["h"]), int(b["x"]), int(b["x"] + b["w"])
        coloured, inked = int((chroma[y0:y1, x0:x1] > 60).sum()), int(dark[y0:y1, x0:x1].sum())
        assert coloured > 500 and inked > 2000, (
            f"{b['id']} looks blank: {coloured} coloured, {inked} inked pixels"
        )
    assert int((chroma[-5:] > 60).sum()) == 0  # control: the margin below the page holds no colour


SIDE_BY_SIDE = """<!DOCTYPE html><html><head><title>harness</title></head><body style="margin:0">
<iframe id="f" src="REPORT" style="width:1400px;height:60000px;border:0;display:block"></iframe><pre id="out">pending</pre>
<script>
document.getElementById('f').addEventListener('load', () => {
  const d = document.getElementById('f').contentDocument;
  const tables = [...d.querySelectorAll('#compare table.compare')];
  const cells = tables.flatMap(t => [...t.querySelectorAll('td, th')]).filter(c => c.rowSpan === 1);
  document.getElementById('out').textContent = JSON.stringify({tables: tables.length,
    right: Math.max(...tables.map(t => Math.ceil(t.getBoundingClientRect().right))),
    page: d.documentElement.scrollWidth, rows_layout: d.querySelectorAll('#compare table.rows').length,
    tallest_cell: Math.max(...cells.map(c => c.getBoundingClientRect().height)),
    text: tables.map(t => t.innerText).join('\\n')});
});
</script></body></html>"""


def test_side_by_side_of_the_h200_export_fits_1400px(tmp_path: Path) -> None:
    """`moelab report --export results/h200x2/export`: six backend variants side by side; with more than
    three they are rows, and the table fits a 1400 px window with no cell broken letter by letter."""
    from typer.testing import CliRunner

    from moelab.cli.main import app

    export = Path(__file__).resolve().parents[2] / "results" / "h200x2" / "export"
    html = tmp_path / "x.html"
    r = CliRunner().invoke(app, ["report", "--export", str(export), "-o", str(html)])
    assert r.exit_code == 0, r.output
    harness = tmp_path / "harness.html"
    harness.write_text(SIDE_BY_SIDE.replace("REPORT", html.as_uri()))
    out = _chromium(
        tmp_path,
        "--allow-file-access-from-files",
        "--window-size=1400,900",
        "--virtual-time-budget=5000",
        "--dump-dom",
        harness.as_uri(),
    )
    found = re.search(r'<pre id="out">(.*?)</pre>', out.stdout, re.S)
    assert found and found.group(1) != "pending", out.stderr[-2000:]
    import html as html_lib

    seen = json.loads(html_lib.unescape(found.group(1)))
    assert seen["tables"] >= 1 and seen["rows_layout"] >= 1, seen
    assert seen["right"] <= 1400, seen  # the side-by-side table (other sections are not this test's)
    assert seen["tallest_cell"] < 100, seen  # no name broken letter by letter into a tall column
    text = seen["text"]
    assert " GB/s" in text and "%" in text and " µs" in text  # units on the numbers
    assert "(reference)" in text and "×" in text  # ratios against a reference that has figures
