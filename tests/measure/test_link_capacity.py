"""The link capacity a run measures (moelab.measure.peaks) pair by pair and with every peer at once, on real
gloo ranks: both stored with their definitions, the same figures on every rank."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.measure.peaks import measure_peaks
from moelab.measure.timing import Clock
from moelab.store.db import connect
from tests.distributed_helpers import run_ranks


def _measure(rank: int, world: int) -> list[dict[str, Any]]:
    clock = Clock(torch.device("cpu"), dist.group.WORLD, flush_l2=False)
    return [
        {"name": p.name, "gbps": p.gbps, "bytes": p.bytes, "definition": p.definition}
        for p in measure_peaks(clock, rank, world, nbytes=3 << 18)
    ]


def test_pair_by_pair_and_every_peer_at_once_on_gloo() -> None:
    ranks = run_ranks(3, _measure)
    names = [p["name"] for p in ranks[0]]
    assert names == ["peer_copy_shift1", "peer_copy_shift2", "peer_exchange_all", "a2a_algbw", "a2a_remote"]
    assert all(math.isfinite(p["gbps"]) and p["gbps"] > 0 for r in ranks for p in r)
    # the slowest rank's median: every rank stores the same figure
    assert all([p["gbps"] for p in r] == [p["gbps"] for p in ranks[0]] for r in ranks)
    every = next(p for p in ranks[0] if p["name"] == "peer_exchange_all")
    assert every["bytes"] == 3 << 18 and "every peer at once" in every["definition"]
    assert "its 2 peers" in every["definition"]
    pair = next(p for p in ranks[0] if p["name"] == "peer_copy_shift1")
    assert pair["definition"].startswith("pair by pair")


@pytest.mark.slow
def test_a_cpu_run_stores_both_capacities_with_their_definitions(tmp_path: Path) -> None:
    """`moelab run` on CPU ranks measures the link capacity as a GPU run does (gloo, smaller buffers) and
    stores each figure with its definition."""
    db = tmp_path / "m.duckdb"
    args = ["run", "--cpu", "--gpus", "3", "--experts-per-rank", "8", "--tokens-per-rank", "32", "--hidden", "128",
            "--sms", "default", "--iters", "2", "--warmup", "0", "--no-health", "--db", str(db), "--out", str(tmp_path / "runs")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    con = connect(db, read_only=True)
    try:
        stored = dict(con.execute("SELECT name, definition FROM measured_peaks").fetchall())
    finally:
        con.close()
    assert {"peer_copy_shift1", "peer_copy_shift2", "peer_exchange_all", "a2a_remote"} <= set(stored)
    assert "every peer at once" in stored["peer_exchange_all"] and stored["peer_copy_shift1"].startswith(
        "pair by pair"
    )
