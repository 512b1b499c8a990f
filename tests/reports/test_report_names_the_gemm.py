"""The report's "best overlapped schedule" table names the expert GEMM each case ran, from its record: the
implementation, the parts' where an overlapped schedule chose apart, and each one's tile. On the 2 x H100
store of round 8 (results/h200x2-r8/after-h100/export) the DeepSeek-V3 tbo micro-batches chose grouped-wide
but ran the ping-pong tile (wide_tile_pad's gap, fixed after); before, only the store's records said so."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.reports.e2e_section import gemm_text
from tests.committed_stores import RESULTS, best_schedule_rows, imported_store

EXPORT = RESULTS / "h200x2-r8" / "after-h100" / "export"
runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return imported_store(EXPORT, tmp_path_factory, "hs")


def test_the_best_schedule_table_names_the_gemm_and_its_tile(store: str, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = runner.invoke(app, ["report", "--run", "hs-ep2", "--format", "md", "-o", str(out), "--db", store])
    assert res.exit_code == 0, res.output
    rows = best_schedule_rows(out.read_text())
    assert len(rows) == 4  # (DeepSeek-V3, reference) x (nccl-a2a, deepep)
    gemms = sorted(r[-1] for r in rows)
    assert gemms.count("grouped (128x256x64 cooperative)") == 2  # the reference: one choice, the wide tile
    deepseek = {r[0]: (r[1], r[-1]) for r in rows if "parts" in r[-1]}
    assert deepseek == {
        "nccl-a2a": (
            "tbo (exchange=splits)",
            "grouped (128x256x64 cooperative); parts grouped-wide (64x128x128 ping-pong)",
        ),
        "deepep": (
            "expert/4",
            "grouped (128x256x64 cooperative); parts grouped-wide (128x256x64 cooperative)",
        ),
    }


def test_gemm_text_from_records() -> None:
    assert gemm_text({}) == "—"
    assert (
        gemm_text({"gemm": "padded", "gemm_kernels": ["nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_NNT"]})
        == "padded"
    )
    same = {"gemm": "grouped", "gemm_part": "grouped", "gemm_kernels": ["128x256x64 cooperative: k"],
            "gemm_kernels_part": ["128x256x64 cooperative: k"]}  # fmt: skip
    assert gemm_text(same) == "grouped (128x256x64 cooperative)"
    assert gemm_text(same | {"gemm_kernels_part": ["64x128x128 ping-pong: k"]}) == (
        "grouped (128x256x64 cooperative); parts grouped (64x128x128 ping-pong)"
    )
