"""The plugin contract (moelab.plugin): a backend in a package of its own, importing only moelab.plugin, is
checked, run, verified and tuned on CPU through the `moelab` command; `moelab backends --check` names each
of the three mistakes that once showed only after a run (an op a whole-timed backend never times, a knob
name the e2e layer reserves, a compared figure defined nowhere), one line each, before anything launches."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.e2e_spec import E2E_KEYS

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
BENCH = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "fake_own_bench.py"
FIGURE = "gather_ep_rank0_bytes_over_mean_time"
ENTRY_POINTS = """[moelab.backends]
gather-ep = gather_ep:GatherBackend
gather-ep-dispatch = gather_ep.mistakes:DispatchOps
gather-ep-chunks = gather_ep.mistakes:ReservedKnob
gather-ep-undefined = gather_ep.mistakes:UndefinedFigure
"""
SMALL = [
    "--hidden",
    "64",
    "--tokens-per-rank",
    "32",
    "--topk",
    "2",
    "--experts-per-rank",
    "2",
    "--iters",
    "3",
]
runner = CliRunner()


@pytest.fixture
def gather_ep(plugin_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package installed as its own distribution (a dist-info with its entry points), on sys.path and
    PYTHONPATH so the ranks find it too; beside the test plugins (test-lib)."""
    root = tmp_path / "site"
    dist = root / "gather_ep-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gather-ep\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    shutil.copytree(PLUGINS / "gather_ep", root / "gather_ep")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(plugin_path)]))
    return root


def _moelab_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    found |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return {m for m in found if m.startswith("moelab")}


@pytest.mark.parametrize(
    "path",
    [
        PLUGINS / "gather_ep" / "__init__.py",
        PLUGINS / "gather_ep" / "mistakes.py",
        PLUGINS / "moelab_testplugins.py",
    ],
    ids=lambda p: p.name,
)
def test_the_example_plugins_import_only_moelab_plugin(path: Path) -> None:
    assert _moelab_imports(path) == {"moelab.plugin"}


def test_check_passes_the_example_and_every_builtin(gather_ep: Path) -> None:
    from moelab.backends.registry import BUILTIN

    for name in ["gather-ep", "test-lib", *BUILTIN]:
        res = runner.invoke(app, ["backends", "--check", name])
        assert res.exit_code == 0, res.output
        assert res.stdout == f"{name}: holds the plugin contract\n"


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "gather-ep-dispatch",
            "gather-ep-dispatch: library_ops: 'dispatch' is never timed: gather-ep-dispatch is timed whole "
            "(phases = False) and offers dispatch_fresh, combine, roundtrip",
        ),
        (
            "gather-ep-chunks",
            "gather-ep-chunks: knob 'chunks': the name is reserved for the e2e layer (reserved: bench, "
            f"{', '.join(E2E_KEYS)}); rename it",
        ),
        (
            "gather-ep-undefined",
            "gather-ep-undefined: library_test: figure 'gather_ep_library_bytes' (dispatch_fresh) is derived by "
            "verify but not defined: add it to the library test's `definitions`",
        ),
    ],
)
def test_check_names_each_mistake_in_one_line(gather_ep: Path, name: str, line: str) -> None:
    res = runner.invoke(app, ["backends", "--check", name])
    assert res.exit_code == 1
    assert line in res.stdout.splitlines()
    if name == "gather-ep-dispatch":  # the library test's comparison reads the same missing op
        assert len(res.stdout.splitlines()) == 2 and "comparison reads op 'dispatch'" in res.stdout
    else:
        assert len(res.stdout.splitlines()) == 1


def test_check_of_an_unknown_backend_is_one_error_line() -> None:
    res = runner.invoke(app, ["backends", "--check", "nope"])
    assert res.exit_code == 2 and res.stderr.startswith("error: unknown backend 'nope'")


@pytest.mark.slow
def test_the_separate_plugin_is_run_verified_and_tuned_on_cpu(
    gather_ep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "p.duckdb"
    res = runner.invoke(
        app, ["run", "--cpu", "-b", "gather-ep", *SMALL, "--db", str(db), "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    with duckdb.connect(str(db), read_only=True) as con:
        cases = con.execute(
            "SELECT status, count(*) FROM cases WHERE backend = 'gather-ep' GROUP BY ALL"
        ).fetchall()
        ops = {
            r[0]
            for r in con.execute("SELECT DISTINCT op FROM results WHERE backend = 'gather-ep'").fetchall()
        }
        errors = con.execute(
            "SELECT max(dispatch_err), max(combine_err) FROM cases WHERE backend = 'gather-ep'"
        ).fetchone()
    assert dict(cases).keys() == {"ok", "unsupported"}, cases  # the SM points: it has no SM control
    assert ops == {"dispatch_fresh", "combine", "roundtrip"} and errors is not None and max(errors) < 1e-2, (
        errors
    )  # status ok: its check passed

    tree = tmp_path / "gather_ep_src"
    tree.mkdir()
    shutil.copy(BENCH, tree / "bench.py")
    (tmp_path / "rates.json").write_text(json.dumps({"bf16": 1234.5}))
    monkeypatch.setenv("FAKE_BENCH", str(tmp_path / "rates.json"))
    vdb = tmp_path / "v.duckdb"
    res = runner.invoke(
        app,
        [
            "verify",
            "--cpu",
            "--no-health",
            "-b",
            "gather-ep",
            "--backend-path",
            f"gather-ep={tree}",
            "--hidden",
            "256",
            "--tokens-per-rank",
            "64",
            "--dtype",
            "bf16",
            "--iters",
            "3",
            "--db",
            str(vdb),
            "--out",
            str(tmp_path / "v"),
        ],
    )
    assert res.exit_code == 1, res.output  # the stand-in's 1234.5 GB/s is not moelab's figure: a mismatch
    with duckdb.connect(str(vdb), read_only=True) as con:
        row = con.execute(
            "SELECT op, figure, library_gbps, moelab_gbps, verdict FROM library_figures"
        ).fetchall()
        stored = con.execute(
            "SELECT gbps FROM bandwidths WHERE op = 'dispatch_fresh' AND definition = ?", [FIGURE]
        ).fetchall()
        text = con.execute("SELECT text FROM definitions WHERE name = ?", [FIGURE]).fetchone()
    assert len(row) == 1 and len(stored) == 1 and text and text[0].startswith("gather-ep's own figure")
    assert row[0] == ("dispatch_fresh", FIGURE, 1234.5, stored[0][0], "fail")

    tdb = tmp_path / "t.duckdb"
    res = runner.invoke(
        app,
        [
            "tune",
            "--cpu",
            "--backend",
            "gather-ep",
            *SMALL,
            "--intermediate",
            "16",
            "--db",
            str(tdb),
            "--out",
            str(tmp_path / "t"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "winner: gather-ep" in res.stdout and "gather-ep: GatherEP(counts=" in res.stdout
    with duckdb.connect(str(tdb), read_only=True) as con:
        ids = " ".join(r[0] for r in con.execute("SELECT case_id FROM cases WHERE status = 'ok'").fetchall())
    assert "counts=all_to_all" in ids and "counts=all_gather" in ids


def test_every_capability_is_in_the_plugin_contract() -> None:
    """A plugin imports only moelab.plugin: every capability protocol a built-in may declare (and the
    dataclasses they return) is exported there."""
    import inspect
    from typing import Protocol

    import moelab.plugin
    from moelab.backends import capabilities

    declared = {
        name
        for name, obj in vars(capabilities).items()
        if inspect.isclass(obj)
        and obj.__module__ == capabilities.__name__
        and not name.startswith("_")
        and (Protocol in getattr(obj, "__mro__", ()) or name == "PartLayouts")
    }
    assert {"BatchedLayout", "HostExpertCounts", "PartLayouts", "RecvHook"} <= declared
    assert declared <= set(moelab.plugin.__all__), declared - set(moelab.plugin.__all__)
