"""Every suite file under benchmarks/ expands through `moelab run --list-cases` at 2 and 4 ranks, for the
backends it has sections for: a suite whose axes cross into a combination the layer refuses as a whole
(mode auto with a chunk count, tbo with four) stops the whole run before any case, which was found only on
the GPU machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SUITES = sorted((ROOT / "benchmarks").glob("*.toml"))


def test_the_benchmark_suites_are_found() -> None:
    assert {"overlap_ep4.toml", "auto_ep4.toml", "overlap_sms_ep4.toml"} <= {p.name for p in SUITES}


@pytest.mark.parametrize("gpus", [2, 4])
@pytest.mark.parametrize("suite", SUITES, ids=[p.name for p in SUITES])
def test_each_benchmark_suite_lists_its_cases(suite: Path, gpus: int) -> None:
    backends = sorted(tomllib.loads(suite.read_text()).get("backend", {})) or ["nccl-a2a"]
    res = CliRunner().invoke(
        app,
        ["run", "--suite", str(suite), "--backend", ",".join(backends), "--gpus", str(gpus), "--list-cases"],
    )
    assert res.exit_code == 0, res.output
    assert " cases (" in res.output and "Error" not in res.output, res.output
