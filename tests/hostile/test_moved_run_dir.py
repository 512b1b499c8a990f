"""A run directory moved while `moelab run` goes on (issue 41): the next job re-created the old path without
spec.json and the advice named the old path. Now the run stops with one line naming where the folder is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hostile.cases import RUN_ARGS
from tests.hostile.world import REPO, World, store_state


@pytest.mark.slow
def test_a_moved_run_directory_stops_the_run_with_its_new_path(tmp_path: Path) -> None:
    w = World.build(tmp_path)
    before = store_state(w.db)
    old, new = w.runs / "r-mv", tmp_path / "moved" / "r-mv"
    argv = ["run", *RUN_ARGS, "--repeat", "2", "--run-id", "r-mv", "--db", str(w.db), "--out", str(w.runs)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moelab.cli.main", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            if old.exists() and any(p.stat().st_size for p in old.rglob("results.jsonl")):
                break
            time.sleep(0.2)
        new.parent.mkdir()
        shutil.move(str(old), str(new))  # a rename on one file system, as `mv` does
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2, text + out.decode(errors="replace")
    assert len(errors) == 1 and f"was moved to {new}" in errors[0] and f"moelab ingest {new}" in errors[0], (
        errors
    )
    assert not old.exists(), sorted(str(p) for p in old.rglob("*"))
    assert (new / "spec.json").is_file()
    assert store_state(w.db) == before
