"""After an nsys job the runner registers each rank's report, and says so when nsys left none
(the Nsight-Compute-bundled nsys on the GPU machines here writes only .qdstrm files)."""

from __future__ import annotations

import json
from pathlib import Path

from moelab.job.rundir import JobFiles
from moelab.tracing.nsys import REPORT_HEADER, collect_reports


def test_reports_are_registered_per_rank(tmp_path: Path) -> None:
    files = JobFiles(tmp_path, "nccl-a2a")
    traces = files.dir / "traces"
    traces.mkdir(parents=True)
    for rank in (1, 0):
        (traces / f"nccl-a2a_rank{rank}.nsys-rep").write_bytes(REPORT_HEADER + b"x" * (10 + rank))
    collect_reports(files)
    data = json.loads((files.dir / "nsys_traces.json").read_text())
    reports = [t for t in data["traces"] if t["kind"] == "nsys"]
    size = len(REPORT_HEADER)
    assert [(t["rank"], t["size_bytes"]) for t in reports] == [(0, size + 10), (1, size + 11)]
    # no nsys here to export them with: the reports stay registered, and the note says why there is no SQLite
    assert data["note"].count("SQLite export failed") == 1 and "nsys not found on PATH" in data["note"]


def test_no_report_is_said(tmp_path: Path) -> None:
    files = JobFiles(tmp_path, "nccl-a2a")
    traces = files.dir / "traces"
    traces.mkdir(parents=True)
    (traces / "nsys-report-03bf.qdstrm").write_bytes(b"q")
    collect_reports(files)
    data = json.loads((files.dir / "nsys_traces.json").read_text())
    assert data["traces"] == []
    assert "no .nsys-rep report" in data["note"] and "nsys-report-03bf.qdstrm" in data["note"]


def test_a_file_that_is_not_a_report_is_said_and_not_registered(tmp_path: Path) -> None:
    """A file named as a report without nsys's header (issue 41: garbage was registered as a trace)."""
    files = JobFiles(tmp_path, "nccl-a2a")
    traces = files.dir / "traces"
    traces.mkdir(parents=True)
    (traces / "nccl-a2a_rank0.nsys-rep").write_bytes(b"garbage report")
    collect_reports(files)
    data = json.loads((files.dir / "nsys_traces.json").read_text())
    assert data["traces"] == []
    assert "nccl-a2a_rank0.nsys-rep is not an nsys report" in data["note"]
