"""The command line through typer's CliRunner: help with an example everywhere, `moelab run` user errors as
one `error:` line and exit code 2 that leave the database as it was, and the read/export/report commands
against a database holding one real (small, CPU, gloo) run made through the CLI once for this module.

This typer's CliRunner keeps stderr apart: `result.stderr` is stderr alone, `result.stdout` stdout alone,
`result.output` both interleaved."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import duckdb
import pytest
import typer
import typer.main
from typer import _click
from typer.core import TyperGroup
from typer.testing import CliRunner, Result

from moelab.backends import registry
from moelab.cli.main import app
from moelab.store.db import migrate
from moelab.store.export import load_export
from tests.argv import with_flags

SMALL = ["--cpu", "--experts-per-rank", "8", "--tokens-per-rank", "32", "--hidden", "128", "--sms", "default",
         "--iters", "2", "--warmup", "0", "--no-health"]  # fmt: skip
COUNTED = ("runs", "cases", "results", "samples")


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(app, args)


def _children(group: _click.Command) -> dict[str, _click.Command]:
    """A click group's subcommands, loading moelab's lazily imported ones."""
    if not isinstance(group, TyperGroup):
        return {}
    load = getattr(group, "load", None)
    return {name: load(name) if load else group.commands[name] for name in group.list_commands(None)}  # type: ignore[arg-type]


def _command_paths(cmd: _click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, child in _children(cmd).items():
        paths += (
            _command_paths(child, (*prefix, name)) if isinstance(child, TyperGroup) else [(*prefix, name)]
        )
    return paths


def _group_paths(cmd: _click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, child in _children(cmd).items():
        if isinstance(child, TyperGroup):
            out.append((*prefix, name))
            out += _group_paths(child, (*prefix, name))
    return out


ROOT = typer.main.get_command(app)
COMMANDS = _command_paths(ROOT)


def test_command_inventory() -> None:
    # a new command shows up here, and so gets the help test below
    assert {"run", "backends", "runs", "report", "ingest", "db", "trace"} <= {p[0] for p in COMMANDS}
    assert ("db", "query") in COMMANDS and ("db", "export") in COMMANDS and ("trace", "summarize") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = _invoke([*path, "--help"])
    assert result.exit_code == 0, result.output
    examples = [line.strip() for line in result.stdout.splitlines() if "Example:" in line]
    assert examples and examples[0].startswith("Example: moelab " + " ".join(path)), result.stdout


@pytest.mark.parametrize("path", [(), *_group_paths(ROOT)], ids=lambda p: " ".join(p) or "moelab")
def test_groups_list_their_commands(path: tuple[str, ...]) -> None:
    result = _invoke([*path, "--help"])
    assert result.exit_code == 0, result.output
    children = {p[len(path)] for p in COMMANDS if p[: len(path)] == path and len(p) > len(path)}
    assert children and all(name in result.stdout for name in children)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(db, runs folder, run id) after one real CPU run through `moelab run`."""
    root = tmp_path_factory.mktemp("cli")
    db, out = root / "moelab.duckdb", root / "runs"
    result = _invoke(["run", *SMALL, "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = list(out.iterdir())
    assert f"stored run {run_dir.name}" in result.stdout
    return db, out, run_dir.name


def _counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COUNTED}  # type: ignore[index]
    finally:
        con.close()


def test_the_stored_run(stored: tuple[Path, Path, str]) -> None:
    db, _, run_id = stored
    counts = _counts(db)
    # nccl-a2a splits its phases and chains pairs: layout, dispatch, dispatch_fresh, combine, roundtrip, pair
    assert counts["runs"] == 1 and counts["cases"] == 1 and counts["results"] == 6
    assert counts["samples"] == 2 * 6 * 2  # 2 ranks x 6 ops x 2 samples (--iters 2)
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute("SELECT run_id, status, world, device FROM runs").fetchone()
    status = con.execute("SELECT status FROM cases").fetchone()
    con.close()
    assert row == (run_id, "complete", 2, "cpu") and status == ("ok",)


def _assert_user_error(result: Result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


BAD_TOML = 'name = "bad"\n[workload\nhidden = 128\n'


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--topk", "8", "--experts-per-rank", "1"], "topk 8 > total experts 2"),
        (["--backend", "no-such-backend"], "unknown backend 'no-such-backend'"),
        (["--suite", "{tmp}/missing.toml"], "no suite"),
        (["--suite", "{tmp}"], "cannot read suite file"),
        (["--suite", "{tmp}/bad.toml"], "malformed suite file"),
        (["--sms", "lots"], "--sms takes whole numbers"),
        (["--sms", "-8"], "sms must be a whole number from 1 to 1,024 or 'default'"),
        (["--launcher", "ssh"], "unknown launcher 'ssh'"),
    ],
    ids=[
        "topk",
        "backend",
        "suite-missing",
        "suite-unreadable",
        "suite-malformed",
        "sms-word",
        "sms-negative",
        "launcher",
    ],  # fmt: skip
)
def test_run_errors_are_one_line_and_leave_the_db_alone(
    stored: tuple[Path, Path, str], tmp_path: Path, args: list[str], needle: str
) -> None:
    db, _, _ = stored
    (tmp_path / "bad.toml").write_text(BAD_TOML)
    out = tmp_path / "runs"
    before = _counts(db)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    # each case changes one flag of SMALL (an option given twice is refused)
    _assert_user_error(
        _invoke(["run", *with_flags(SMALL, *args), "--db", str(db), "--out", str(out)]), needle
    )
    assert _counts(db) == before
    assert not out.exists(), "a failed run left a run directory"


def test_run_with_an_unwritable_db_fails_before_measuring(
    stored: tuple[Path, Path, str], tmp_path: Path
) -> None:
    db, _, _ = stored
    before = _counts(db)
    out = tmp_path / "runs"
    # root ignores file modes, so a read-only folder would not stop it; /proc refuses new files to anyone
    _assert_user_error(
        _invoke(["run", *SMALL, "--db", "/proc/moelab-test.duckdb", "--out", str(out)]),
        "cannot open database /proc/moelab-test.duckdb",
    )
    assert not out.exists() and not Path("/proc/moelab-test.duckdb").exists()
    assert _counts(db) == before


def test_dry_run_prints_torchrun_and_writes_nothing(stored: tuple[Path, Path, str], tmp_path: Path) -> None:
    db, _, _ = stored
    before = _counts(db)
    fresh_db, out = tmp_path / "fresh.duckdb", tmp_path / "runs"
    for target in (db, fresh_db):
        result = _invoke(["run", *SMALL, "--dry-run", "--db", str(target), "--out", str(out)])
        assert result.exit_code == 0, result.output
        cmd = [line for line in result.stdout.splitlines() if "torch.distributed.run" in line]
        assert len(cmd) == 1 and "--nproc-per-node 2" in cmd[0] and "-m moelab.measure.worker" in cmd[0]
        assert "--max-restarts 0" in cmd[0]
    assert _counts(db) == before
    assert not fresh_db.exists() and not out.exists()


def test_runs_lists_the_run(stored: tuple[Path, Path, str]) -> None:
    db, _, run_id = stored
    result = _invoke(["runs", "--db", str(db)])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if run_id in line]
    assert "complete" in line and "nccl-a2a" in line and "dispatch-combine" in line


def test_runs_without_a_db_says_so(tmp_path: Path) -> None:
    result = _invoke(["runs", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 0 and "no database at" in result.stdout
    assert not (tmp_path / "none.duckdb").exists()


def test_db_query_is_read_only_without_write(stored: tuple[Path, Path, str], tmp_path: Path) -> None:
    db, _, run_id = stored
    result = _invoke(["db", "query", "SELECT run_id, world FROM runs", "--db", str(db)])
    assert result.exit_code == 0 and run_id in result.stdout
    before = _counts(db)
    _assert_user_error(
        _invoke(["db", "query", "UPDATE runs SET label = 'changed'", "--db", str(db)]), "read-only"
    )
    _assert_user_error(_invoke(["db", "query", "DELETE FROM results", "--db", str(db)]), "read-only")
    assert _counts(db) == before
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT label FROM runs").fetchall() == [(None,)]
    con.close()
    # the same statement with --write does change a copy: read-only is what stopped it
    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    result = _invoke(["db", "query", "UPDATE runs SET label = 'changed'", "--db", str(copy), "--write"])
    assert result.exit_code == 0, result.output
    con = duckdb.connect(str(copy), read_only=True)
    assert con.execute("SELECT label FROM runs").fetchall() == [("changed",)]
    con.close()
    _assert_user_error(_invoke(["db", "query", "SELEC 1", "--db", str(db)]), "query failed")


def test_db_export_parquet(stored: tuple[Path, Path, str], tmp_path: Path) -> None:
    db, _, run_id = stored
    out = tmp_path / "export"
    result = _invoke(["db", "export", "--format", "parquet", "-o", str(out), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").exists() and (out / "results.parquet").exists()
    con = duckdb.connect()
    migrate(con)
    assert load_export(con, out) == [run_id]
    assert con.execute("SELECT count(*) FROM results").fetchone() == (6,)  # the six ops of nccl-a2a
    con.close()
    _assert_user_error(
        _invoke(["db", "export", "-o", str(tmp_path / "x"), "--run", "nope", "--db", str(db)]), "no such run"
    )


def test_report_and_export_take_a_label_as_run(stored: tuple[Path, Path, str], tmp_path: Path) -> None:
    """--run takes a label wherever it takes a run id (report and db export named only ids before)."""
    db, _, run_id = stored
    copy = tmp_path / "labelled.duckdb"
    shutil.copy(db, copy)
    assert _invoke(["label", run_id, "mine", "--db", str(copy)]).exit_code == 0
    out = tmp_path / "r.md"
    result = _invoke(["report", "--run", "mine", "--format", "md", "-o", str(out), "--db", str(copy)])
    assert result.exit_code == 0, result.output
    assert run_id in out.read_text()
    export = tmp_path / "export"
    result = _invoke(["db", "export", "--run", "mine", "-o", str(export), "--db", str(copy)])
    assert result.exit_code == 0, result.output
    con = duckdb.connect()
    migrate(con)
    assert load_export(con, export) == [run_id]
    con.close()
    _assert_user_error(_invoke(["report", "--run", "nope", "--db", str(copy)]), "no such run")


def test_report_of_one_case_leads_with_the_summary(stored: tuple[Path, Path, str], tmp_path: Path) -> None:
    """One measured case: the summary answers, and no chart of a single bar is drawn (nor an empty
    section per absent sweep: one line says what these runs do not hold)."""
    db, _, run_id = stored
    out = tmp_path / "x.html"
    result = _invoke(["report", "-o", str(out), "--db", str(db)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert run_id in html and html.index('id="summary"') < html.index('id="results"')
    assert "nccl-a2a (only one)" in html and "<svg" not in html
    assert "Not in these runs: an SM sweep" in html and "No SM sweep" not in html


def test_backends_lists_availability() -> None:
    result = _invoke(["backends"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") >= 4}
    assert "available" in rows["nccl-a2a"].split("│")[2] and "unavailable" not in rows["nccl-a2a"]
    if importlib.util.find_spec("deep_ep") is not None:
        pytest.skip("deep_ep is installed here")
    cells = [c.strip() for c in rows["deepep"].split("│")]
    reason = registry.availability("deepep")
    assert cells[2] == "unavailable" and reason and cells[3] and reason.startswith(cells[3][:40])
