"""Every row of the hostile-input table (tests/hostile/cases.py) through the `moelab` command: its exit
code, exactly one `error:` line (or the failure stored for its case, and said), the store unchanged or the
run stored exactly once, no file written outside the run directories, the store and the row's outputs, and
no process left behind; then the row's own check."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tests.hostile.checked_rows  # noqa: F401  (adds the rows with checks of their own to CASES)
import tests.hostile.concurrent_and_old  # noqa: F401  (adds the concurrent commands and old stores)
import tests.hostile.hunted  # noqa: F401  (adds the rows found by hunting the issue's classes)
import tests.hostile.second_pass  # noqa: F401  (adds the second pass's rows to CASES)
from tests.hostile.cases import CASES, Hostile
from tests.hostile.world import (
    Outcome,
    World,
    file_hashes,
    files_under,
    processes_naming,
    rows_of,
    store_state,
    without_run,
    written_outside,
)


def _param(c: Hostile) -> object:
    marks: list[pytest.MarkDecorator] = [pytest.mark.slow] if c.slow else []
    if c.xfail:
        marks.append(pytest.mark.xfail(reason=c.xfail, strict=True))
    return pytest.param(c, id=c.id, marks=marks)


def test_the_table_covers_every_area() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    areas = {c.area for c in CASES}
    assert {"store", "ingest", "labels", "db", "export", "gate", "report", "suite", "signals"} <= areas


def _run(w: World, c: Hostile, argv: list[object]) -> Outcome:
    if c.via == "cli":
        assert all(isinstance(a, str) for a in argv), "bytes arguments need via='proc'"
        return w.cli([str(a) for a in argv])
    if c.via == "proc":
        return w.proc(argv, env=w.env, preexec=w.preexec)
    assert c.via == "during" and (w.signal or w.act) and w.ready is not None
    return w.interfered([str(a) for a in argv])


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World.build(tmp_path_factory.mktemp("hostile-template"))


@pytest.mark.parametrize("c", [_param(c) for c in CASES])
def test_hostile_input(tmp_path: Path, template: World, c: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    w = template.copy_to(tmp_path)
    monkeypatch.chdir(tmp_path)  # a relative output path of an in-process command lands in the case's folder
    argv = c.make(w)  # breaks the inputs, then says what to run
    before, kept, files = store_state(w.store), file_hashes(w.keep), files_under(tmp_path)
    for target, value in w.patches.items():
        assert c.via == "cli", "a replaced attribute reaches only an in-process command"
        monkeypatch.setattr(target, value)
    out = _run(w, c, argv)
    said = f"exit {out.code}\nstdout: {out.stdout[-3000:]}\nstderr: {out.stderr[-3000:]}"
    assert out.exception is None, f"{type(out.exception).__name__}: {out.exception}\n{said}"
    assert "Traceback" not in out.stdout + out.stderr, said
    assert "\x1b" not in out.stdout + out.stderr, f"a raw ESC byte printed\n{said}"
    assert out.code == c.code, said
    if c.expect == "error":
        assert len(out.error_lines) == 1 and c.says in out.error_lines[0], said
    else:
        assert not out.error_lines, said
    if c.expect == "ok":
        assert c.says in out.stdout, said
    if c.expect == "failure":
        sql = "SELECT reason FROM cases WHERE list_contains(?, run_id) AND status = 'failed'"
        reasons = [r[0] or "" for r in rows_of(w.db, sql, [list(c.stored_once)])]
        assert any(c.says in r for r in reasons), (reasons, said)
        assert "warning:" in out.stderr or "why jobs failed:" in out.stdout, said  # and the failure said
    after = store_state(w.store)
    if c.store == "unchanged":
        assert after == before, f"the store changed\n{said}"
    elif c.store == "migrated":  # an older store a write command migrated: the row's check reads it
        assert c.check is not None
    else:
        assert c.stored_once
        assert without_run(after, *c.stored_once) == without_run(before, *c.stored_once), (
            f"other rows changed\n{said}"
        )
        for run_id in c.stored_once:
            assert rows_of(w.store, "SELECT count(*) FROM runs WHERE run_id = ?", [run_id]) == [(1,)], said
    assert file_hashes(w.keep) == kept, f"files a failed command must keep changed\n{said}"
    assert not [p for p in w.absent if p.exists() or p.is_symlink()], f"files written\n{said}"
    assert not (escaped := written_outside(w, files)), f"files written outside its folders: {escaped}\n{said}"
    if c.check is not None:
        c.check(w, out)
    deadline = time.monotonic() + 10
    while (left := processes_naming(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
