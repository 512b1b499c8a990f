"""Issue 6 acceptance: a real two-"node" run on this machine. Two `moelab run --launcher torchrun` processes
(node 0 and node 1, 2 CPU ranks each on gloo) join one c10d rendezvous on localhost; all 4 ranks' results
land in node 0's run directory and only node 0 stores the run, with RDMA-byte accounting that matches a hand
computation from the routing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from moelab.core.routing import route_all
from moelab.core.workload import Workload, payload_bytes_per_token

WORLD, GPUS_PER_NODE = 4, 2
WL = Workload(hidden=128, tokens_per_rank=16, topk=2, experts_per_rank=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hand_rdma_bytes() -> tuple[float, float]:
    """Mean over ranks of (token, destination node) pairs x bytes per token: all pairs, and other nodes only."""
    pairs, remote = [], []
    for rank, routing in enumerate(route_all(WL, WORLD)):
        own = rank // GPUS_PER_NODE
        nodes_per_token = [
            {expert // WL.experts_per_rank // GPUS_PER_NODE for expert in row}
            for row in routing.topk_idx.tolist()
        ]
        pairs.append(sum(len(n) for n in nodes_per_token))
        remote.append(sum(len(n - {own}) for n in nodes_per_token))
    bpt = payload_bytes_per_token(WL.hidden, WL.dtype)
    return sum(pairs) * bpt / WORLD, sum(remote) * bpt / WORLD


def _run_two_nodes(tmp_path: Path, run_id: str, outs: list[Path], dbs: list[Path]) -> list[str]:
    """Start node 0 and node 1 at once, as two hosts would; returns their outputs once both exit 0."""
    port = _free_port()
    procs = []
    for node in (0, 1):
        argv = [
            sys.executable, "-m", "moelab.cli.main", "run", "--cpu", "--nodes", "2", "--gpus-per-node", "2",
            "--launcher", "torchrun", "--rdzv-endpoint", f"127.0.0.1:{port}", "--node-rank", str(node),
            "--run-id", run_id, "--out", str(outs[node]), "--db", str(dbs[node]),
            "--no-health", "--experts-per-rank", "2", "--topk", "2", "--tokens-per-rank", "16", "--hidden", "128",
            "--sms", "default", "--iters", "2", "--warmup", "0", "--timeout", "120", "--collective-timeout", "60",
        ]  # fmt: skip
        log = (tmp_path / f"node{node}.log").open("w")
        procs.append(
            (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)), log)
        )
    codes = []
    try:
        for proc, _ in procs:
            codes.append(proc.wait(timeout=240))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = [(tmp_path / f"node{n}.log").read_text() for n in (0, 1)]
    assert codes == [0, 0], "\n".join(logs)
    assert f"stored run {run_id}" in logs[0]
    assert f"node 1: jobs done; node 0 stores run {run_id}" in logs[1]
    return logs


@pytest.mark.slow
def test_two_node_torchrun_run(tmp_path: Path) -> None:
    run_id = "two-node-test"
    dbs = [tmp_path / f"node{n}" / "moelab.duckdb" for n in (0, 1)]
    _run_two_nodes(tmp_path, run_id, [tmp_path / f"node{n}" / "runs" for n in (0, 1)], dbs)

    # node 0's run directory holds every rank's results and environment
    run_dir = tmp_path / "node0" / "runs" / run_id / "nccl-a2a"
    assert (run_dir / "results.jsonl").exists() and (run_dir / "env.json").exists()

    con = duckdb.connect(str(dbs[0]), read_only=True)
    try:
        assert con.execute("SELECT run_id, world, nodes, gpus_per_node, status FROM runs").fetchall() == [
            (run_id, WORLD, 2, GPUS_PER_NODE, "complete")
        ]
        assert con.execute("SELECT status FROM cases").fetchall() == [("ok",)]
        assert [r[0] for r in con.execute("SELECT DISTINCT rank FROM samples ORDER BY rank").fetchall()] == [
            0,
            1,
            2,
            3,
        ]
        env = con.execute("SELECT rank, node FROM environment ORDER BY rank").fetchall()
        assert env == [(0, 0), (1, 0), (2, 1), (3, 1)]
        bw = dict(
            con.execute(
                "SELECT definition, bytes_mean FROM bandwidths WHERE op = 'dispatch' AND definition LIKE 'rdma%'"
            ).fetchall()
        )
    finally:
        con.close()
    rdma_pairs, rdma_remote = _hand_rdma_bytes()
    assert 0 < rdma_remote < rdma_pairs  # the routing does cross nodes, and stays on them too
    assert bw["rdma_pairs"] == pytest.approx(rdma_pairs)
    assert bw["rdma_remote"] == pytest.approx(rdma_remote)

    # node 1 measured but stored nothing
    if dbs[1].exists():
        con = duckdb.connect(str(dbs[1]), read_only=True)
        try:
            assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        finally:
            con.close()


@pytest.mark.slow
def test_two_nodes_sharing_one_folder_and_db(tmp_path: Path) -> None:
    """As on a cluster whose home (the default --out and --db) is one shared filesystem."""
    run_id = "two-node-shared"
    out, db = tmp_path / "runs", tmp_path / "moelab.duckdb"
    _run_two_nodes(tmp_path, run_id, [out, out], [db, db])
    assert (out / run_id / "nccl-a2a" / "results.jsonl").exists()  # node 0's: the one stored
    assert (out / "node1" / run_id / "nccl-a2a" / "results.jsonl").exists()  # node 1's own copy
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT run_id, world, run_dir FROM runs").fetchall() == [
            (run_id, WORLD, str((out / run_id).resolve()))
        ]
        assert con.execute("SELECT count(DISTINCT rank) FROM samples").fetchone() == (WORLD,)
    finally:
        con.close()
