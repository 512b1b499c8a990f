"""Nothing lost when storing fails (issue 26, items 5, 6 and 8), through the `moelab` command in real processes:

- a full disk at COMMIT: the error names the cause, never "cannot rollback - no transaction is active",
  the store is as it was, and `moelab ingest` of the same directory stores the run once the disk has room;
- a run whose store step fails keeps its run directory, and the `moelab ingest` its message gives stores it;
- a run directory that cannot be written mid-run stops the run with the cause and the backends not run,
  run.json not left "running", and what finished is stored by `moelab ingest` afterwards;
- run-directory files that are links are not followed, logs are read from their tail, messages are capped;
- a database of an older moelab is refused by read-only commands with one line, and `moelab db migrate`
  brings it up to date.

A full disk is stood in for by RLIMIT_FSIZE in the child with SIGXFSZ ignored: a write past the limit fails
with EFBIG ("File too large") exactly where a full file system fails it with ENOSPC. Where the failure must
hit one particular write of the launching process, the write is made to fail with ENOSPC in that process.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from moelab.store.schema import LATEST_VERSION
from tests.hostile.world import REPO, World, rows_of, store_state

RUN_ARGS = ["--cpu", "--hidden", "256", "--tokens-per-rank", "64", "--experts-per-rank", "4", "--topk", "2"]
RUN_ARGS += ["--sms", "default", "--warmup", "1", "--iters", "5", "--timeout", "150"]


def moelab(*argv: str, preexec: object = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moelab.cli.main", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec,  # type: ignore[arg-type]
    )


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


def disk_full_at(limit: int) -> object:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World.build(tmp_path)


def test_a_full_disk_at_commit_names_the_cause_and_ingest_stores_the_run_once_there_is_room(
    world: World,
) -> None:
    before = store_state(world.db)
    full = moelab("ingest", str(world.new_run), "--db", str(world.db), preexec=disk_full_at(8192))
    assert full.returncode == 2, full.stderr
    (line,) = error_lines(full)
    assert "File too large" in line and "nothing was stored" in line, line
    assert "cannot rollback" not in full.stderr and "Traceback" not in full.stderr
    assert store_state(world.db) == before
    again = moelab("ingest", str(world.new_run), "--db", str(world.db))
    assert again.returncode == 0, again.stderr
    assert rows_of(world.db, "SELECT count(*) FROM runs WHERE run_id = 'r-new'") == [(1,)]
    assert rows_of(world.db, "SELECT count(*) FROM cases WHERE run_id = 'r-new' AND status = 'ok'") == [(2,)]


def _wait(what: str, check: object, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_run_whose_store_step_fails_keeps_its_directory_and_the_ingest_it_names_stores_it(
    tmp_path: Path,
) -> None:
    db, runs = tmp_path / "store" / "m.duckdb", tmp_path / "runs"
    argv = ["run", *RUN_ARGS, "--no-health", "--run-id", "r-kept", "--db", str(db), "--out", str(runs)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moelab.cli.main", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # while it measures, the database goes away (moved to another disk, say) and a folder takes its place
        _wait("the job to start", lambda: (runs / "r-kept" / "nccl-a2a" / "launcher.log").exists())
        shutil.move(db, tmp_path / "moved.duckdb")
        db.mkdir()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "its run directory is kept" in line and "cannot open database" in line, line
    suggested = re.search(r"`moelab (ingest .*?)`", line)
    assert suggested is not None, line
    assert (runs / "r-kept" / "nccl-a2a" / "results.jsonl").exists()
    db.rmdir()  # the cause fixed: the database back in its place
    shutil.move(tmp_path / "moved.duckdb", db)
    stored = moelab(*suggested.group(1).split())
    assert stored.returncode == 0, stored.stderr
    assert rows_of(db, "SELECT status FROM runs WHERE run_id = 'r-kept'") == [("complete",)]
    assert rows_of(db, "SELECT count(*) FROM cases WHERE run_id = 'r-kept' AND status = 'ok'") == [(1,)]


# The launching process's write of the first backend's health_after.json fails with ENOSPC, as on a disk that
# filled while the job ran (the rest of the process runs as it is).
ENOSPC_AT = """
import errno, os, pathlib, sys
real = pathlib.Path.write_text
def write_text(self, *args, **kwargs):
    if self.name == "health_after.json" and self.parent.name == "nccl-a2a":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
    return real(self, *args, **kwargs)
pathlib.Path.write_text = write_text
sys.argv = ["moelab", *sys.argv[1:]]
from moelab.cli.main import app
app()
"""


@pytest.mark.slow
def test_a_run_directory_that_cannot_be_written_stops_the_run_and_says_what_did_not_run(
    tmp_path: Path,
) -> None:
    db, runs = tmp_path / "m.duckdb", tmp_path / "runs"
    argv = ["run", *RUN_ARGS, "--backend", "nccl-a2a,mxfp8-a2a", "--run-id", "r-full", "--db", str(db)]
    done = subprocess.run(
        [sys.executable, "-c", ENOSPC_AT, *argv, "--out", str(runs)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done)
    assert "cannot write run directory" in line and "No space left on device" in line, line
    assert "during backend nccl-a2a" in line and "not run: mxfp8-a2a" in line, line
    assert "Traceback" not in done.stderr
    run_dir = runs / "r-full"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and "No space left on device" in info["reason"]
    assert not (run_dir / "mxfp8-a2a").exists()
    stored = moelab("ingest", str(run_dir), "--db", str(db))
    assert stored.returncode == 0, stored.stderr
    cases = dict(rows_of(db, "SELECT backend, status FROM cases WHERE run_id = 'r-full'"))
    assert cases == {"nccl-a2a": "ok", "mxfp8-a2a": "failed"}


def test_links_in_a_run_directory_are_not_followed_and_messages_are_capped(world: World) -> None:
    secret = world.path("secret.txt")
    secret.write_text("SECRET-LINE\n" * 3)
    world.edit_json(world.job("job.json"), lambda d: d.update(returncode=1, description="rank 0 failed"))
    world.link(world.job("rank0.log"), secret)
    world.link(world.job("rank1.log"), "/dev/zero")
    world.job("rank0.error.json").write_text(json.dumps({"type": "RuntimeError", "message": "m" * 200_000}))
    with world.job("rank2.log").open("w") as log:  # a chatty rank: 20 MB, the line that matters at the end
        for _ in range(20_000):
            log.write("x" * 999 + "\n")
        log.write("LAST-LINE\n")
    done = moelab("ingest", str(world.new_run), "--db", str(world.db), timeout=60)
    assert done.returncode == 0, done.stderr
    rows = rows_of(
        world.db, "SELECT rank, exc_message, log_tail FROM failure_diagnosis WHERE run_id = 'r-new'"
    )
    assert rows and all("SECRET" not in (tail or "") for _, _, tail in rows)
    assert max(len(msg or "") for _, msg, _ in rows) <= 20_000
    tails = {rank: tail for rank, _, tail in rows}
    assert tails[2].endswith("LAST-LINE\n") and len(tails[2]) < 30_000
    ((tails,),) = rows_of(world.db, "SELECT stderr_tails FROM jobs WHERE run_id = 'r-new'")
    assert "SECRET" not in str(tails)


def test_a_200kb_error_message_is_one_capped_line() -> None:
    import contextlib
    import io

    from moelab.cli.common import MESSAGE_MAX, fail

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        fail("boom " + "x" * 200_000)
    (line,) = err.getvalue().splitlines()
    assert line.startswith("error: boom ") and len(line) < MESSAGE_MAX + 100 and "more characters" in line


def test_an_older_database_is_refused_by_read_only_commands_until_migrated(world: World) -> None:
    old = world.db_at_version(4)
    refused = moelab("report", "-o", str(world.path("r.html")), "--db", str(old))
    assert refused.returncode == 2
    assert error_lines(refused) == [
        f"error: database {old} has schema version 4, older than this moelab ({LATEST_VERSION}): "
        f"migrate it with `moelab db migrate --db {old}` (a copy first, if older moelabs still use it)"
    ]
    migrated = moelab("db", "migrate", "--db", str(old))
    assert migrated.returncode == 0, migrated.stderr
    assert f"migrated from schema version 4 to {LATEST_VERSION}" in migrated.stdout
    assert rows_of(old, "SELECT max(version) FROM schema_version") == [(LATEST_VERSION,)]
    assert rows_of(old, "SELECT run_id FROM runs") == [("old-1",)]
    again = moelab("db", "migrate", "--db", str(old))
    assert f"already at schema version {LATEST_VERSION}" in again.stdout
    runs = moelab("runs", "--db", str(old))
    assert runs.returncode == 0 and "old-1" in runs.stdout, runs.stderr


def test_db_query_cannot_write_through_a_hard_link_or_another_file(world: World) -> None:
    os.link(world.db, world.path("link.duckdb"))
    before = rows_of(world.db, "SELECT count(*) FROM samples")
    for sql in (
        f"ATTACH '{world.path('link.duckdb')}' AS h (READ_WRITE); DELETE FROM h.samples",
        f"COPY samples TO '{world.path('out.csv')}'",
        f"ATTACH '{world.path('new.duckdb')}' AS n; CREATE TABLE n.t AS SELECT 1",
    ):
        done = moelab("db", "query", sql, "--db", str(world.db))
        assert done.returncode == 2 and len(error_lines(done)) == 1, done.stderr
    assert rows_of(world.db, "SELECT count(*) FROM samples") == before and before[0][0] > 0
    assert not world.path("out.csv").exists() and not world.path("new.duckdb").exists()
    written = moelab("db", "query", "DELETE FROM labels", "--write", "--db", str(world.db))
    assert written.returncode == 0, written.stderr  # --write: the same SQL is the user's to run


def test_an_export_replaces_its_folder_whole_and_a_mixed_folder_is_refused(world: World) -> None:
    out = world.path("export")
    first = moelab("db", "export", "--out", str(out), "--run", "r1", "--db", str(world.db))
    assert first.returncode == 0, first.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runs"] == ["r1"] and set(manifest["files"]) == {p.name for p in out.glob("*.parquet")}
    second = moelab("db", "export", "--out", str(out), "--run", "r2", "--db", str(world.db))
    assert second.returncode == 0, second.stderr
    assert json.loads((out / "manifest.json").read_text())["runs"] == ["r2"]
    assert sorted(p.name for p in world.root.iterdir() if p.name.startswith(".export")) == []
    con = duckdb.connect()
    from moelab.store.db import migrate
    from moelab.store.export import load_export

    migrate(con)
    assert load_export(con, out) == ["r2"]


def test_an_export_with_force_never_replaces_a_folder_holding_the_store_or_a_stored_run(world: World) -> None:
    """--force replaces --out whole: a folder that holds the store (or lies above it), or a stored run's
    directory, is refused before anything is written, and the store and the runs are as they were."""
    before = store_state(world.db)
    stored_dirs = [
        Path(d) for (d,) in rows_of(world.db, "SELECT run_dir FROM runs WHERE run_dir IS NOT NULL")
    ]
    assert any(
        d.is_relative_to(world.runs) and d.exists() for d in stored_dirs
    )  # the world stores its runs there
    for out in (world.db.parent, world.root, world.runs):
        done = moelab("db", "export", "--out", str(out), "--force", "--db", str(world.db))
        assert done.returncode == 2, done.stderr
        (line,) = error_lines(done)
        assert "which the store needs" in line and "Traceback" not in done.stderr, line
    assert store_state(world.db) == before and all(d.exists() for d in stored_dirs)
    beside = moelab("db", "export", "--out", str(world.path("export")), "--force", "--db", str(world.db))
    assert beside.returncode == 0, beside.stderr  # a folder of its own, forced or not
