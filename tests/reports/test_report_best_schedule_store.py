"""The report's "fastest overlapped layer" table on a committed 2 x H200 store (results/h200x2-r6: every
preset and backend ran serial, tbo, expert, the comm variants and auto), read back through `moelab report`.
Mode auto chose serial in every block there; before, that case (about 1x its own serial layer) was named
the fastest overlapped layer, hiding the tbo layers that lose 22-50% to serial."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.committed_stores import RESULTS, best_schedule_rows, imported_store

EXPORT = RESULTS / "h200x2-r6" / "export"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return imported_store(EXPORT, tmp_path_factory, "r6")


def _interval(text: str) -> tuple[float, float]:
    low, high = text.strip("[]").split(", ")
    return float(low), float(high)


def test_the_fastest_overlapped_layer_overlaps_and_its_lead_over_serial_has_an_interval(
    store: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.md"
    res = CliRunner().invoke(
        app, ["report", "--run", "r6-ep2", "--format", "md", "-o", str(out), "--db", store]
    )
    assert res.exit_code == 0, res.output
    rows = best_schedule_rows(out.read_text())
    assert len(rows) == 9  # 5 presets x (nccl-a2a, deepep), deepep refused one (fp8 needs hidden % 128)
    assert not [r for r in rows if r[1].startswith("auto:serial")], rows
    for r in rows:
        vs, (low, high) = float(r[8]), _interval(r[9])
        assert low <= vs <= high and high < 1.0, r  # every fastest overlapped layer loses to serial here
        assert float(r[10]) < 1.0 and r[11].startswith("[")
        assert r[3] in ("shared", "0", "24"), r  # an SM count, not a float (was 0.0 and 24.0)
