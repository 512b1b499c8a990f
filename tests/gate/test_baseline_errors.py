"""A baseline folder of junk is one error line and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.synthetic_runs import RunModel, build_db


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"manifest.json": "{not json"}, "not a moelab export manifest"),
        ({"manifest.json": "[1, 2]"}, "export version None"),
        (
            {"manifest.json": '{"export_version": 1, "format": "xml", "tables": [], "runs": []}'},
            "lacks a known format",
        ),
        (
            {"manifest.json": '{"export_version": 1, "format": "csv", "tables": ["nope"], "runs": ["a"]}'},
            "unknown table",
        ),
        (
            {"manifest.json": '{"export_version": 1, "format": "csv", "tables": ["runs"], "runs": ["a"]}'},
            "runs.csv is missing",
        ),
        (
            {
                "manifest.json": '{"export_version": 1, "format": "parquet", "tables": ["runs"], "runs": ["a"]}',
                "runs.parquet": "junk",
            },
            "not a readable parquet",
        ),
    ],
)
def test_junk_baseline_folder(tmp_path: Path, files: dict[str, str], match: str) -> None:
    folder = tmp_path / "junk"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    db = tmp_path / "db.duckdb"
    build_db(db, tmp_path / "runs", [RunModel(run_id="cand", created_at="2026-11-22T07:00:00+00:00")])
    res = CliRunner().invoke(app, ["check", "--baseline", str(folder), "--db", str(db)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and match in res.output
