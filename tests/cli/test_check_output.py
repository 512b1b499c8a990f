"""`moelab check` on a terminal: the verdict first, then one table, each cause said once as a footnote
that the rows point to (before, the same 9-line contended note repeated on every row, cut mid-word)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.gate.test_gate_refusals import store  # noqa: F401  (the fixture: runs on a quiet and a busy machine)


@pytest.mark.parametrize("width", [80, 120])
def test_verdict_first_and_one_footnote_per_cause(store: Path, width: int) -> None:  # noqa: F811
    r = CliRunner().invoke(
        app, ["check", "--db", str(store), "--baseline", "base", "--run", "busy"], env={"COLUMNS": str(width)}
    )
    assert r.exit_code == 4, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("CONTENDED:"), lines[0]
    footnotes = [line for line in lines if re.match(r"\[\d+\] ", line)]
    assert footnotes, r.stdout
    # every op of the run was contended for the same cause: one footnote, pointed to by every row
    assert len(footnotes) == 1 and "host-load" in footnotes[0], footnotes
    assert r.stdout.count("host-load") == 1
    assert r.stdout.count("[1]") >= 3
