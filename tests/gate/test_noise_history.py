"""The history the gate learns an op's noise from (moelab.store.noise_history): earlier runs of the same
case on the same hardware and software only, never the baseline, never a case contended while it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from moelab.store.db import connect
from moelab.store.noise_history import earlier_process_medians
from tests.gate.history_runs import history
from tests.synthetic_runs import RunModel, build_db

QUIET = dict(tokens=(256,), sms=(None,), iters=20, noise=0.005)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("noisehist")
    db = root / "n.duckdb"
    runs = history(4, **QUIET) + [
        RunModel(run_id="h100", created_at="2026-11-10T07:00:00+00:00", gpu_name="NVIDIA H100", **QUIET),  # type: ignore[arg-type]
        RunModel(run_id="newer_nccl", created_at="2026-11-11T07:00:00+00:00", nccl="2.29.1", **QUIET),  # type: ignore[arg-type]
        RunModel(run_id="busy", created_at="2026-11-12T07:00:00+00:00", contended="host load 9", **QUIET),  # type: ignore[arg-type]
        RunModel(
            run_id="rep", created_at="2026-11-13T07:00:00+00:00", repeats=3, process_noise=0.01, **QUIET
        ),  # type: ignore[arg-type]
        RunModel(run_id="base", created_at="2026-11-14T07:00:00+00:00", **QUIET),  # type: ignore[arg-type]
        RunModel(run_id="cand", created_at="2026-11-15T07:00:00+00:00", **QUIET),  # type: ignore[arg-type]
    ]
    build_db(db, root / "runs", runs)
    return db


def test_only_the_same_hardware_and_software_and_never_the_baseline(store: Path) -> None:
    con = connect(store, read_only=True)
    try:
        found = earlier_process_medians(con, "cand", leave_out=("base",))
    finally:
        con.close()
    assert {k[2] for k in found} == {"dispatch", "combine", "roundtrip"}
    for runs in found.values():
        # hist0-3 (one process each) and rep (three): not the H100 run, the newer NCCL, the contended run,
        # the baseline or the candidate itself
        assert [len(r) for r in runs] == [1, 1, 1, 1, 3]
