"""`moelab check` on the store of the 2xH200 GPU acceptance run (results/gpu-acceptance/h200x2/earlier/export),
as its reader step runs it: three defects that store showed, each through the command."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from moelab.cli.main import app
from tests.committed_stores import RESULTS, import_export

EXPORT = RESULTS / "gpu-acceptance" / "h200x2" / "earlier" / "export"


def test_check_on_the_acceptance_store(tmp_path: Path) -> None:
    db = str(tmp_path / "acc.duckdb")
    import_export(EXPORT, Path(db))
    runner = CliRunner()
    result = runner.invoke(app, ["check", "--run", "acc-a2a", "--baseline", "acc-repeat", "--db", db])
    out = result.output
    # run acc-a2a, not acc-a2a-lib (the newest run its label pointed at, which matched no baseline case)
    assert "no case of run acc-a2a-lib" not in out and "run: acc-a2a\n" in out, out
    assert result.exit_code == 3, out  # cannot judge at one and two starts: the gate's answer, not a crash
    # advice --repeat can follow (it said 10000, past the 1,000 it takes), and each rule named once
    assert "--repeat 10000" not in out and "more starts than --repeat allows (1,000)" in out, out
    assert "spread: spread" not in out and "drift: drift" not in out, out
