"""Hardware truth: a link peak comes from what the machine reported (NVML's active NVLink links, their
count and generation, else the PCIe link), the datasheet only as a labelled fallback; and with one rank
nothing crossed a link, so no link figure or bound is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.cli.run_cmd import print_answer, print_run_summary
from moelab.model.links import LinkFacts, reported_link
from moelab.store.db import connect
from tests.fixtures.health.fake_nvml import recorded_snapshot
from tests.synthetic_runs import BackendModel, RunModel, build_db

H100_SXM = "NVIDIA H100 80GB HBM3"


def test_reported_link_from_nvml_facts() -> None:
    nvl = reported_link(
        LinkFacts(nvlinks_active=18, nvlink_version=6, nvlink_speed_mbps=26562, pcie_gen=5, pcie_width=16)
    )
    assert (
        nvl is not None
        and nvl.link == "NVLink4 18 x 26.56 GB/s"
        and nvl.gbps == pytest.approx(478.1, abs=0.1)
    )
    assert "per-link rate from NVML" in nvl.source and nvl.intra == "nvlink"
    # no speed from NVML (or an implausible one): the generation's per-link rate, said so
    for speed in (None, 3):
        sheet = reported_link(LinkFacts(nvlinks_active=8, nvlink_version=6, nvlink_speed_mbps=speed))
        assert (
            sheet is not None
            and sheet.link == "NVLink4 8 x 26.56 GB/s"
            and "NVLink4 datasheet" in sheet.source
        )
    a100 = reported_link(LinkFacts(nvlinks_active=12, nvlink_version=4))  # nvmlNvlinkVersion_t 4 = NVLink 3.0
    assert a100 is not None and a100.link == "NVLink3 12 x 25.00 GB/s" and a100.gbps == 300
    pcie = reported_link(LinkFacts(nvlinks_active=0, pcie_gen=5, pcie_width=16))
    assert pcie is not None and pcie.link == "PCIe Gen5 x16" and pcie.intra == "pcie"
    assert pcie.gbps == pytest.approx(63.0, abs=0.05)
    assert reported_link(LinkFacts()) is None


def _with_snapshot(db: Path, run_id: str, backend: str, snapshot: dict[str, object]) -> None:
    con = connect(db)
    try:
        con.execute(
            "INSERT INTO health (run_id, backend, phase, host, node, worst, findings, snapshot) "
            "VALUES (?, ?, 'before', 'node1', 0, 'pass', '[]', ?)",
            [run_id, backend, json.dumps(snapshot)],
        )
    finally:
        con.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An H100 whose NVML shows no NVLink link, an H200 with 18, an H100 with no reading, one rank."""
    root = tmp_path_factory.mktemp("links")
    db = root / "l.duckdb"
    slow = (BackendModel(name="nccl-a2a", peak_gbps=40),)
    build_db(db, root / "runs", [
        RunModel(run_id="pcie", created_at="2026-11-20T07:00:00+00:00", gpu_name=H100_SXM, backends=slow),
        RunModel(run_id="nvlink", created_at="2026-11-21T07:00:00+00:00", gpu_name="NVIDIA H200", backends=slow),
        RunModel(run_id="unread", created_at="2026-11-22T07:00:00+00:00", gpu_name=H100_SXM, backends=slow),
        RunModel(run_id="one", created_at="2026-11-23T07:00:00+00:00", gpu_name=H100_SXM, world=1),
    ])  # fmt: skip
    _with_snapshot(db, "pcie", "nccl-a2a", recorded_snapshot(root, "pcie_only_h100x2").to_dict())
    _with_snapshot(db, "nvlink", "nccl-a2a", recorded_snapshot(root, "healthy_h200x2").to_dict())
    return db


def _report(db: Path, run: str, out: Path) -> str:
    result = CliRunner().invoke(app, ["report", "--db", str(db), "--run", run, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_text()


def test_peak_is_what_nvml_reported(stores: Path, tmp_path: Path) -> None:
    pcie = _report(stores, "pcie", tmp_path / "p.html")
    shown = pcie[: pcie.index('<section id="definitions">')]
    assert "63.02 GB/s (PCIe Gen5 x16; NVML)" in shown and "NVLink4" not in shown
    # the bound of moelab model takes the same link: peers over PCIe
    assert "pcie: pcie 63 GB/s" in shown and "NVML: no active NVLink link" in shown
    nvlink = _report(stores, "nvlink", tmp_path / "n.html")
    assert "478.1 GB/s (NVLink4 18 x 26.56 GB/s; NVML)" in nvlink
    unread = _report(stores, "unread", tmp_path / "u.html")
    assert "478.1 GB/s (NVLink4 18 x 26.56 GB/s; datasheet)" in unread
    assert "datasheet fallback: no NVML link reading stored with this run" in unread  # its title says why


def test_one_rank_shows_no_link_figures(
    stores: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html = _report(stores, "one", tmp_path / "o.html")
    assert "one rank: nothing crossed a link, so no link bandwidth, link peak or bound is shown" in html
    results = html[
        html.index('<table class="results">') : html.index("</table>", html.index('<table class="results">'))
    ]
    rows = [r for r in results.split("<tr>")[2:]]
    # nvl_recv, nvl_remote, % peak, % measured, % bound: all dashes
    assert rows and all(
        r.split("</td>")[6:11] == ["<td>—", "<td>—", '<td class="">—', "<td>—", "<td>—"] for r in rows
    )
    md = tmp_path / "o.md"
    assert (
        CliRunner()
        .invoke(app, ["report", "--db", str(stores), "--run", "one", "--format", "md", "-o", str(md)])
        .exit_code
        == 0
    )
    assert "> one rank: nothing crossed a link" in md.read_text()
    _, view = print_run_summary(stores, "one")
    print_answer(view)
    out = capsys.readouterr().out
    assert "NVL GB/s" not in out and "% bound" not in out.split("summary:")[0]
    assert "one rank: nothing crossed a link" in out


def test_a_peaks_file_wins_over_nvml(stores: Path, tmp_path: Path) -> None:
    """`moelab compare --peaks FILE`: the user's entry, then what NVML reported, then the datasheet."""
    from moelab.model.links import load_peaks
    from moelab.reports import hardware, query

    peaks = tmp_path / "peaks.toml"
    peaks.write_text('[gpu."H100"]\nlink = "lab PCIe"\ngbps = 100\n')
    con = connect(stores, read_only=True)
    try:
        query.select_runs(con, ["pcie", "nvlink", "unread"])
        env, snaps = query.environment(con), query.health_snapshots(con)
    finally:
        con.close()
    user = hardware.job_links(snaps, env, load_peaks(peaks))
    own = hardware.job_links(snaps, env, load_peaks(None))
    assert [
        (p.gbps, hardware.basis(p)) for p in (user.get("pcie", "nccl-a2a"), user.get("nvlink", "nccl-a2a"))
    ] == [
        (100, "peaks file"),
        (pytest.approx(478.1, abs=0.1), "NVML"),
    ]
    assert (
        hardware.basis(own.get("pcie", "nccl-a2a")) == "NVML"
        and hardware.basis(own.get("unread", "nccl-a2a")) == "datasheet"
    )
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--db",
            str(stores),
            "--by",
            "run",
            "--run",
            "pcie",
            "--run",
            "nvlink",
            "--peaks",
            str(peaks),
        ],
    )
    assert result.exit_code == 0, result.output
