"""Flags grouped by kind and counted: N cases carrying the same flag are one group, each case once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.reports.flags import result_flags
from moelab.store.db import connect
from tests.synthetic_runs import BackendModel, RunModel, build_db

SMS = (4, 8, 12, 16, 20, 24, 28, 32, 36, 40)  # ten cases
SPREAD = "spread: dispatch IQR/median 31.0% is over 3x its noise target (5.0%)"
NOISY = "median noise 9.0% above the 5% target after 40 iterations"


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten cases of one backend, every one suspect for the same reason and its dispatch unstable."""
    root = tmp_path_factory.mktemp("flags")
    db = root / "f.duckdb"
    build_db(db, root / "runs", [RunModel(run_id="ten", backends=(BackendModel(name="nccl-a2a"),), sms=SMS)])
    con = connect(db)
    try:
        con.execute("UPDATE cases SET suspect = true, suspect_reason = ? WHERE status = 'ok'", [SPREAD])
        con.execute("UPDATE results SET stability = ? WHERE op = 'dispatch'", [NOISY])
    finally:
        con.close()
    return db


def _write(db: Path, out: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["report", "--db", str(db), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return out.read_text()


def test_n_cases_with_one_flag_render_as_one_group(flagged: Path, tmp_path: Path) -> None:
    html = _write(flagged, tmp_path / "r.html")
    section = html[html.index('<section id="flags">') : html.index('<section id="results">')]
    groups = re.findall(r'<details class="flag">(.*?)</details>', section, re.S)
    titles = [re.search(r"</span> (.*?)</summary>", g, re.S).group(1) for g in groups]  # type: ignore[union-attr]
    assert titles == ["suspect: spread far above its reference", "unstable: median noise above target"]
    for g in groups:
        assert ">10 cases</span>" in g and g.count("<li>") == 10  # counted once, each case listed once
    spread = groups[0]
    assert "dispatch IQR/median 31.0%" in spread and spread.count("sm4:") == 1
    assert section.count(SPREAD) == 0  # the explanation is said once, not the sentence per case
    # the results table carries short badges whose text opens on demand
    assert html.count(">suspect</summary>") == 3 * 10 and html.count(">unstable</summary>") == 10


def test_markdown_groups_the_same_way(flagged: Path, tmp_path: Path) -> None:
    md = _write(flagged, tmp_path / "r.md", "--format", "md")
    flags = md[md.index("## Flags") : md.index("## Results")]
    bullets = [ln for ln in flags.splitlines() if ln.startswith("- **")]
    assert bullets == [
        "- **suspect: spread far above its reference** (10 cases): an op's IQR/median far above the case's own "
        "history, or above 3x the 5% noise target (GPU runs)",
        "- **unstable: median noise above target** (10 cases): the median's 95% interval stayed wider than the "
        "noise target up to the most iterations allowed",
    ]
    assert "| unstable |" not in md and md.count("suspect, unstable") == 10  # badges: short labels per row


def test_several_reasons_of_one_case_land_in_their_own_groups() -> None:
    rows = [
        {"run_id": "r", "backend": "b", "case_id": f"c{i}", "op": "dispatch", "suspect": True,
         "suspect_reason": "host-load: host load 3.6 on 2 cores (1.6 beyond); moelab-run: another moelab run (x, pid 9) ran",
         "stability": "median noise 45.7% above the 5% target; p10-p90 spread 240% of the median (more than one mode)"}
        for i in range(3)
    ]  # fmt: skip
    groups = {g.kind: g for g in result_flags(rows, several_runs=False).build()}
    assert set(groups) == {"suspect:host-load", "suspect:moelab-run", "unstable:noise", "unstable:modes"}
    assert all(g.count == 3 for g in groups.values())
    assert groups["suspect:host-load"].items[0].detail == "3.6 on 2 cores"
    assert groups["unstable:modes"].items[0].detail == "dispatch 240%"
    assert [b[0] for b in rows[0]["badges"]] == ["suspect", "unstable"]


def test_console_marks_unstable_and_suspect_medians(
    flagged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from moelab.cli.failures import print_failures
    from moelab.cli.run_cmd import print_run_summary

    _, view = print_run_summary(flagged, "ten")
    print_failures(flagged, "ten", view.flag_groups)
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if "nccl-a2a" in x and "│" in x]
    dispatch = [x for x in rows if "│ dispatch " in x]
    combine = [x for x in rows if "│ combine " in x]
    # unstable, suspect, and contended: the host load was measured while it ran (issue 38)
    assert len(dispatch) == 10 and all("│ ~!# │" in x for x in dispatch)
    assert len(combine) == 10 and all("│ !#  │" in x for x in combine)  # suspect and contended
    assert "marks: ~ unstable median" in out and "! suspect case" in out
    # the flags below the table: each kind once, counted, its first cases listed
    assert out.count("suspect: spread far above its reference (10 cases)") == 1
    assert "… and 6 more (moelab report lists them all)" in out
