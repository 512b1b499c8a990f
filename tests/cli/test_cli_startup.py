"""Commands that measure nothing import neither torch nor scipy (each in a fresh process, sys.modules
read after the command ran). Their start-up time is shown by benchmarks/cli_startup.py, not asserted.
Two may import scipy, never torch (issue 38): `report --history`, whose steps come from ruptures, and a
`check` that judges ops, whose noise test takes Student's t quantiles from scipy.stats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from moelab.cli.main import COMMANDS, build_command
from moelab.store.export import export_runs
from tests.synthetic_history import HistoryModel, build

HEAVY = ("torch", "scipy")
ROOT = Path(__file__).resolve().parent.parent.parent

PROBE = """
import json, sys
from moelab.cli.main import app
code = 0
try:
    app(sys.argv[2:], prog_name="moelab")
except SystemExit as exc:
    code = exc.code or 0
with open(sys.argv[1], "w") as fh:
    json.dump({"code": code, "modules": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}, fh)
""".replace("HEAVY", repr(HEAVY))


def _probe(tmp_path: Path, args: list[str]) -> dict[str, object]:
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.exists(), proc.stderr
    result: dict[str, object] = json.loads(out.read_text())
    result["stderr"] = proc.stderr
    return result


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("startup")
    path = root / "h.duckdb"
    con = duckdb.connect(str(path))
    build(con, HistoryModel(runs=30, samples_per_run=600, steps={("deepep", "dispatch"): [(15, 1.2)]}))
    export_runs(con, root / "baseline", "parquet", ["r000000"])
    con.close()
    return path


def _cases(db: Path, tmp: Path) -> list[list[str]]:
    d = ["--db", str(db)]
    return [
        ["--help"],
        ["runs", *d],
        ["report", "--help"],
        ["report", "--history", *d, "-o", str(tmp / "h.html")],
        ["report", "--run", "r000029", "--format", "md", *d, "-o", str(tmp / "r.md")],
        ["compare", "--help"],
        ["compare", "--by", "run", "--groups", "3", *d],
        ["check", "--help"],
        # the history changes driver and NCCL on the way: a check across them is allowed explicitly
        [
            "check",
            "--baseline",
            str(db.parent / "baseline"),
            "--run",
            "r000029",
            "--allow-different-hardware",
            *d,
        ],
        ["label", "r000001", "golden", *d],
        ["db", "--help"],
        ["db", "query", "SELECT count(*) FROM runs", *d],
        ["doctor", "--help"],
        ["trace", "--help"],
        ["trace", "summarize", "--help"],
        ["model", "--nodes", "2", "--json"],  # uniform routing: the closed form, no generator
    ]


@pytest.mark.slow
def test_instant_commands_import_no_torch_or_scipy(db: Path, tmp_path: Path) -> None:
    for args in _cases(db, tmp_path):
        result = _probe(tmp_path, args)
        judges = args[0] == "check" and "--help" not in args or args[:2] == ["report", "--history"]
        modules = [m for m in result["modules"] if not (judges and m.split(".")[0] == "scipy")]  # type: ignore[attr-defined]
        assert modules == [], f"moelab {' '.join(args)} imported {result['modules']}"
        # check exits 1 on the regression the history holds; everything else succeeds
        assert result["code"] in ((0, 1) if args[0] == "check" else (0,)), (args, result["stderr"])


@pytest.mark.slow
def test_the_probe_can_fail() -> None:
    """`moelab run --help` imports torch (run needs it): the probe sees it, so the test above can fail."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "/dev/stdout", "run", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert '"torch"' in out.stdout.splitlines()[-1]


def test_help_summaries_are_the_commands_docstrings() -> None:
    """`moelab --help` lists the table in main.py without importing the commands: it must say what they say."""
    import inspect

    from moelab.cli.main import load_target

    for name, entry in COMMANDS.items():
        target = load_target(entry.target)
        doc = target.info.help if hasattr(target, "info") else inspect.getdoc(target)
        first = " ".join(str(doc).split("\n\n")[0].split())
        assert entry.summary == first, name
        assert build_command(name, entry).name == name
