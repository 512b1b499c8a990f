"""A flag typer cannot parse is one `error:` line and exit 2, like every other user error."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["run", "--iters", "many"], "Invalid value for '--iters'"),
        (["run", "--timeout", "abc"], "Invalid value for '--timeout'"),
        (["run", "--no-such-flag"], "No such option"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], match: str) -> None:
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], res.output


def test_help_still_works() -> None:
    res = CliRunner().invoke(app, ["run", "--help"])
    assert res.exit_code == 0 and "Workload" in res.output and "Launch" in res.output
