"""`moelab compare` and `moelab run` at 80 and 120 columns: no line wider than the terminal, no name cut
short ("…"), no word broken across lines.

compare reads the stored 2×H200 runs (results/h200x2/export, imported through `moelab db import`): six
backend variants of three backends, knobs in their names, so the names cannot all stand whole side by side.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.committed_stores import RESULTS, import_export

EXPORT = RESULTS / "h200x2" / "export"
RUNS = "20261122T070145Z-3c8758,20261122T070330Z-80e91c"  # mxfp8-a2a, nccl-a2a, hybrid-ep, deepep


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("h200") / "h200.duckdb"
    assert "imported 11 runs" in import_export(EXPORT, db)
    return db


def _too_wide(out: str, width: int) -> list[str]:
    return [line for line in out.splitlines() if cell_len(line) > width]


def _whole(name: str, out: str) -> bool:
    """`name` printed on one line, not glued to a longer word."""
    return re.search(rf"(?<![\w=-]){re.escape(name)}(?![\w=-])", out) is not None


@pytest.mark.parametrize("width", [80, 120])
def test_compare_fits_and_names_every_backend_and_op_whole(h200: Path, width: int) -> None:
    r = CliRunner().invoke(app, ["compare", "--db", str(h200), "--run", RUNS], env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "…" not in out
    assert _too_wide(out, width) == []
    listed = CliRunner().invoke(app, ["compare", "--db", str(h200), "--run", RUNS, "--format", "json"])
    records = json.loads(listed.stdout)
    ops, backends = {r["op"] for r in records}, {r["backend"].split()[0] for r in records}
    assert len(backends) >= 3, backends
    table = out[out.index("by backend") :]
    for name in ops | backends:
        assert _whole(name, table), name
    # each variant's full name, whole: in the table or in its legend (A = hybrid-ep fused=false handle=cached)
    for variant in ("hybrid-ep fused=false handle=cached", "mxfp8-a2a combine_impl=mxfp8 layout=fresh"):
        assert variant in out or all(_whole(w, table) for w in variant.split()), variant
    # the answer comes first
    assert out.splitlines()[0].startswith(("combine:", "dispatch:", "pair:"))


def test_compare_wide_terminal_puts_backends_side_by_side(h200: Path) -> None:
    r = CliRunner().invoke(
        app, ["compare", "--db", str(h200), "--run", "20261122T070330Z-80e91c"], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    assert "B vs A" in r.stdout and "A = hybrid-ep fused=false handle=cached (reference)" in r.stdout
    assert _too_wide(r.stdout, 200) == []


@pytest.mark.parametrize("fmt", ["csv", "json", "md"])
def test_compare_formats_for_scripts(h200: Path, fmt: str) -> None:
    r = CliRunner().invoke(
        app, ["compare", "--db", str(h200), "--run", "20261122T070330Z-80e91c", "--format", fmt]
    )
    assert r.exit_code == 0, r.output
    if fmt == "json":
        records = json.loads(r.stdout)
        assert {rec["backend"] for rec in records} == {"hybrid-ep fused=false handle=cached", "nccl-a2a"}
        assert all(rec["median_us"] > 0 for rec in records)
    elif fmt == "csv":
        lines = r.stdout.splitlines()
        assert lines[0].startswith("case,op,sms,backend,run_id,median_us") and len(lines) == 1 + 18
    else:
        assert "| op | SMs |" in r.stdout and "nccl-a2a vs hybrid-ep fused=false handle=cached" in r.stdout


def test_one_backend_says_what_to_do_next(h200: Path) -> None:
    r = CliRunner().invoke(app, ["compare", "--db", str(h200), "--run", "20261122T070936Z-78d3a8"])
    assert r.exit_code == 2
    assert "only one backend (nccl-a2a)" in r.output and "moelab run --backend nccl-a2a,OTHER" in r.output


RUN = ["run", "--cpu", "--backend", "nccl-a2a", "--sms", "default,16", "--experts-per-rank", "8",
       "--tokens-per-rank", "32", "--hidden", "128", "--iters", "2", "--warmup", "0", "--no-health"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
def test_run_console_breaks_no_word(tmp_path: Path, width: int) -> None:
    """A real CPU run (2 gloo ranks; one case gloo cannot run, so a reason is printed too): every line
    within the width, and each case id, op, status and reason word printed whole."""
    db = tmp_path / "m.duckdb"
    r = CliRunner().invoke(
        app, [*RUN, "--db", str(db), "--out", str(tmp_path / "runs")], env={"COLUMNS": str(width)}
    )
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert _too_wide(out, width) == []
    assert re.search(r"\S…", out) is None  # nothing cut short ("dispa…"); "ranks …" says work goes on
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        cases = con.execute("SELECT backend, case_id, status, coalesce(reason, '') FROM cases").fetchall()
        ops = [o for (o,) in con.execute("SELECT DISTINCT op FROM results").fetchall()]
    words = {w for _, _, _, reason in cases for w in reason.split()}
    names = {b for b, *_ in cases} | {c for _, c, _, _ in cases} | {s for *_, s, _ in cases} | set(ops)
    assert len(cases) == 2 and "unsupported" in {s for *_, s, _ in cases}
    for name in names | words | {"indistinguishable", "fastest"} - {""}:
        if name in ("indistinguishable", "fastest") and name not in out.replace("\n", " "):
            continue  # a word this run's summary does not use
        assert _whole(name, out), name
