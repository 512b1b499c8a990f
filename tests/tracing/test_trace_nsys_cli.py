"""`moelab run --trace nsys` end to end, through the command, with a stand-in nsys that behaves as the real
one in each case moelab must handle: it writes a report per rank (registered and exported to SQLite), it
leaves only .qdstrm files (one warning naming them, exit 1, measurements stored), or it fails (the job is a
recorded failure). Before, the traces folder was never made and the collection never ran, so every one of
these passed silently."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.argv import with_flags
from tests.launch.test_crash_isolation import SMALL

pytestmark = pytest.mark.slow  # real gloo ranks, each under the stand-in nsys

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "nsys" / "fake_nsys.py"


def _fake_nsys_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    bin_dir = tmp_path / "nsys-bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    shutil.copy(nsys, bin_dir / "QdstrmImporter")  # a full install has its importer beside nsys
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NSYS_MODE", mode)


def _run(tmp_path: Path) -> tuple[int, str, Path]:
    out = tmp_path / "runs"
    timing = ["--sms", "default", "--iters", "2", "--warmup", "1", "--no-health", "--quiet"]
    args = [
        "run",
        "--cpu",
        "--trace",
        "nsys",
        *with_flags(timing, *SMALL),
        "--out",
        str(out),
        "--run-id",
        "nsys-run",
    ]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output, out / "nsys-run" / "nccl-a2a"


def test_each_ranks_report_is_registered_and_exported(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nsys_on_path(tmp_path, monkeypatch, "report")
    code, output, job_dir = _run(tmp_path)
    assert code == 0, output
    assert "warning" not in output
    with duckdb.connect(str(db_path), read_only=True) as con:
        rows = con.execute(
            "SELECT rank, kind, path FROM traces WHERE run_id = 'nsys-run' ORDER BY ALL"
        ).fetchall()
        description = con.execute("SELECT description FROM jobs").fetchone()
    assert [(r, k) for r, k, _ in rows] == [(0, "nsys"), (0, "nsys-sqlite"), (1, "nsys"), (1, "nsys-sqlite")]
    assert all((job_dir.parent / p).is_file() for _, _, p in rows)
    assert description == ("ok",)


def test_only_qdstrm_left_is_said_once_and_fails_the_run(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nsys_on_path(tmp_path, monkeypatch, "qdstrm")
    code, output, job_dir = _run(tmp_path)
    assert code == 1, output
    warnings = [line for line in output.splitlines() if "--trace nsys" in line]
    assert len(warnings) == 2, output  # the warning as the job ends, the error line at the end
    assert "nccl-a2a_rank0.qdstrm" in warnings[0] and "QdstrmImporter" in warnings[0]
    assert warnings[1].startswith("error: nccl-a2a: --trace nsys made no usable trace")
    with duckdb.connect(str(db_path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM traces").fetchone() == (0,)
        (description,) = con.execute("SELECT description FROM jobs").fetchone()
        statuses = con.execute("SELECT DISTINCT status FROM cases").fetchall()
    assert "no .nsys-rep report" in description and statuses == [("ok",)]  # the measurements are kept


def test_nsys_that_fails_is_a_recorded_failure(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nsys_on_path(tmp_path, monkeypatch, "fail")
    code, output, _ = _run(tmp_path)
    assert code == 1, output
    with duckdb.connect(str(db_path), read_only=True) as con:
        statuses = con.execute("SELECT DISTINCT status FROM cases").fetchall()
        job = con.execute("SELECT status FROM jobs").fetchone()
    assert statuses == [("failed",)] and job == ("failed",)
    assert "nsys wrote no .nsys-rep report" in output
