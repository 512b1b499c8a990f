"""What `moelab run` prints, through the command on real CPU ranks: an estimate held against cases of the
same kind, marks and their legend, flags grouped, and the summary last with the note on drift."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app

SMALL = ["--cpu", "--experts-per-rank", "8", "--tokens-per-rank", "32", "--hidden", "128", "--sms", "default,16",
         "--iters", "2", "--warmup", "0", "--no-health"]  # fmt: skip


@pytest.mark.slow
def test_console_leads_to_the_answer(tmp_path: Path) -> None:
    args = ["run", *SMALL, "--db", str(tmp_path / "m.duckdb"), "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    lines = out.splitlines()
    first = next(x for x in lines if "case 1/2" in x)
    # the case left is one gloo cannot run (an SM count): it costs nothing, whatever the first one took
    assert "-smdef: ok" in first and first.endswith("about 0.0 s left")
    assert any("case 2/2" in x and "-sm16: unsupported" in x for x in lines)
    summary = out[out.index("summary: median ±95% interval") :]
    assert "nccl-a2a (only one)" in summary and summary.count("dispatch") >= 1
    assert "drift between runs not judged: a cpu run" in summary
    assert out.index("not measured") < out.index("summary: median") < out.index("stored run")
