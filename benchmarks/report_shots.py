"""PNG shots of `moelab report` as headless Chromium draws it at 1280 px: what a reader sees first.

    # a first CPU run: `moelab run --cpu` into a scratch store, then its report
    python benchmarks/report_shots.py --cpu-run --png results/report-shots/cpu-first-run.png
    # the 2xH200 exports in results/ (loaded as `moelab check --baseline FOLDER` loads one)
    python benchmarks/report_shots.py --exports 'results/h200x2*/**/export' --run r4-suite-warm \
        --baseline r4-suite-cold --png results/report-shots/h200x2-r4-suite.png
    # a store brought back from a GPU machine
    python benchmarks/report_shots.py --db moelab.duckdb --png results/report-shots/h100x1.png

The report is written by the command a user types (`python -m moelab.cli.main report`, `--baseline`
included), drawn by Chromium at 1280 px wide down to the page's end or `--max-height`, and kept as a
256-colour PNG (a page of tables and charts stays well under 1 MB). Prints the page's width and height,
the shot's size and the PNG's bytes; `--json FILE` writes them. Needs the `chromium` package.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moelab.store.db import connect  # noqa: E402
from moelab.store.export import load_export  # noqa: E402
from moelab.store.labels import resolve_run  # noqa: E402

WIDTH = 1280
HARNESS = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="REPORT" style="width:WIDTHpx;height:60000px;border:0;display:block"></iframe><pre id="out">pending</pre>
<script>
document.getElementById('f').addEventListener('load', () => {
  const d = document.getElementById('f').contentDocument;
  document.getElementById('out').textContent = JSON.stringify({width: d.documentElement.scrollWidth,
    height: Math.ceil(d.body.getBoundingClientRect().bottom) + 24});
});
</script></body></html>"""


def moelab(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "moelab.cli.main", *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"moelab {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium not found (apt-get install -y chromium)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=180, check=False)


def page_size(html: Path, work: Path) -> dict[str, int]:
    harness = work / "harness.html"
    harness.write_text(HARNESS.replace("REPORT", html.as_uri()).replace("WIDTH", str(WIDTH)))
    out = chromium(
        work / "profile",
        "--allow-file-access-from-files",
        "--virtual-time-budget=5000",
        f"--window-size={WIDTH},800",
        "--dump-dom",
        harness.as_uri(),
    )
    found = re.search(r'<pre id="out">(.*?)</pre>', out.stdout, re.S)
    if not found or found.group(1) == "pending":
        raise SystemExit(f"could not measure {html}: {out.stderr[-1000:]}")
    return json.loads(found.group(1).replace("&quot;", '"'))


def shoot(html: Path, png: Path, max_height: int, work: Path) -> dict[str, Any]:
    from PIL import Image

    size = page_size(html, work)
    height = min(size["height"], max_height)
    raw = work / "shot.png"
    chromium(work / "profile", f"--window-size={WIDTH},{height}", f"--screenshot={raw}", html.as_uri())
    if not raw.exists():
        raise SystemExit(f"chromium wrote no screenshot of {html}")
    png.parent.mkdir(parents=True, exist_ok=True)
    Image.open(raw).convert("RGB").quantize(colors=256).save(png, optimize=True)
    return {
        "png": str(png),
        "page_width": size["width"],
        "page_height": size["height"],
        "shot_height": height,
        "bytes": png.stat().st_size,
    }


def store_from_exports(pattern: str, db: Path) -> None:
    con = connect(db)
    try:
        for folder in sorted(glob.glob(str(ROOT / pattern), recursive=True)):
            load_export(con, Path(folder))
    finally:
        con.close()


def run_ids(db: Path, refs: list[str]) -> list[str]:
    """Run ids or labels, as ids (the report's --run takes ids)."""
    con = connect(db, read_only=True)
    try:
        return [resolve_run(con, r) for r in refs]
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--db", type=Path, help="a moelab store")
    src.add_argument("--exports", help="a glob of export folders under the repository root")
    src.add_argument(
        "--cpu-run", action="store_true", help="make a first CPU run (moelab run --cpu) and shoot it"
    )
    ap.add_argument("--run", action="append", default=[], help="run id or label (default: the newest run)")
    ap.add_argument("--baseline", help="moelab report --baseline: a run id, label or export folder")
    ap.add_argument("--png", type=Path, required=True)
    ap.add_argument("--max-height", type=int, default=3200, help="px of the page kept, from its top")
    ap.add_argument("--html", type=Path, help="also keep the report's HTML here")
    ap.add_argument("--json", type=Path, help="write the figures printed here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moelab-shots-") as tmp:
        work = Path(tmp)
        db = args.db or work / "shots.duckdb"
        if args.exports:
            store_from_exports(args.exports, db)
        elif args.cpu_run:
            print(moelab("run", "--cpu", "--db", str(db), "--out", str(work / "runs"))[-3000:])
        report = ["report", "--db", str(db), "-o", str(work / "report.html")]
        report += [a for r in run_ids(db, args.run) for a in ("--run", r)]
        report += ["--baseline", args.baseline] if args.baseline else []
        moelab(*report)
        if args.html:
            args.html.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "report.html", args.html)
        figures = shoot(work / "report.html", args.png, args.max_height, work)
    print(json.dumps(figures, indent=2))
    if figures["page_width"] > WIDTH:
        print(f"warning: the page is {figures['page_width']} px wide, more than {WIDTH}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
