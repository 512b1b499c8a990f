"""Synthetic run directories for report, compare, label and gate tests: the files a real run leaves
(spec.json, run.json, per-backend job.json, env.json, results.jsonl), written without torch processes and
read into DuckDB by the real ingest. Times follow latency = alpha + bytes / bandwidth(SMs) with seeded
lognormal noise, so sweeps, knees and fits have known answers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moelab.core.case_record import CaseRecord, CheckResult
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.rows import RankRows
from moelab.core.spec import CaseSpec, LaunchSpec, RunSpec, TimingSpec
from moelab.core.workload import RoutingSpec, Workload, payload_bytes_per_token
from moelab.job.rundir import JobFiles, RunDir
from moelab.measure.timing import median_noise
from moelab.store.db import connect
from moelab.store.ingest import ingest
from moelab.suites.loader import case_id_for


@dataclass(kw_only=True)
class BackendModel:
    name: str
    alpha_us: float = 20.0
    peak_gbps: float = 300.0  # bandwidth with all SMs; fewer SMs scale it down (saturating at sat_sms)
    sat_sms: int = 24
    library_versions: dict[str, str] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    rank_skew: float = 0.0  # rank r of W runs at 1 + skew * (2r / (W - 1) - 1) of the level: uneven ranks


@dataclass(kw_only=True)
class RunModel:
    run_id: str
    created_at: str = "2026-11-22T07:00:00+00:00"
    label: str | None = None
    backends: Sequence[BackendModel] = (BackendModel(name="nccl-a2a"),)
    host: str = "gpu-node-1"
    gpu_name: str | None = "NVIDIA H200"
    sm_count: int = 132
    driver: str = "580.65.06"
    nccl: str = "2.28.9"
    torch: str = "2.11.0+cu130"
    hidden: int = 1024
    tokens: Sequence[int] = (512,)
    sms: Sequence[int | None] = (None,)
    topk: int = 8
    experts_per_rank: int = 8
    world: int = 2
    iters: int = 40
    noise: float = 0.03  # lognormal sigma of each rank's sample
    slowdown: float = 1.0  # multiplies every time (a regression when > 1)
    seed: int = 0
    incorrect: Sequence[str] = ()  # backend names whose cases fail the correctness check
    gpus_per_node: int | None = None
    dtype: str = "bf16"  # dispatch payload (combine is bf16)
    repeats: int = 1  # starts of each backend job (moelab run --repeat), each written as its own job
    contended: str | None = None  # a host-load finding during every job (ingest marks its cases suspect)
    process_noise: float = 0.0  # lognormal sigma of each start's level (the variation between processes)


def _rows(tokens: int, topk: int, world: int, epr: int) -> list[dict[str, int]]:
    """Uniform routing, expected counts: each token reaches min(topk, experts)/experts of the ranks."""
    ranks_hit = min(world, topk)
    recv = tokens * ranks_hit
    remote = recv - tokens * ranks_hit // world
    return [
        {"rank": r, "recv_rows": recv, "recv_rows_remote": remote, "send_rows": recv, "send_rows_remote": remote,
         "rdma_pairs": tokens, "rdma_pairs_remote": 0}
        for r in range(world)
    ]  # fmt: skip


def write_run(root: Path, m: RunModel) -> Path:
    rng = np.random.default_rng(m.seed)
    cases = []
    for b in m.backends:
        for t in m.tokens:
            for s in m.sms:
                wl = Workload(
                    hidden=m.hidden,
                    tokens_per_rank=t,
                    topk=m.topk,
                    experts_per_rank=m.experts_per_rank,
                    routing=RoutingSpec(kind="uniform", seed=0),
                    dtype=m.dtype,
                )
                cases.append(
                    CaseSpec(
                        case_id=case_id_for(wl, s, b.knobs),
                        backend=b.name,
                        workload=wl,
                        sms=s,
                        knobs=dict(b.knobs),
                    )
                )
    spec = RunSpec(
        run_id=m.run_id, created_at=m.created_at, suite="synthetic", backends=tuple(b.name for b in m.backends),
        cases=tuple(cases), timing=TimingSpec(iters=m.iters, warmup=2, pair_reps=5),
        launch=LaunchSpec(device="cuda", nproc_per_node=m.world, gpus_per_node=m.gpus_per_node or m.world,
                          repeats=m.repeats),
        label=m.label, command=("moelab", "run", "--synthetic"),
    )  # fmt: skip
    rd = RunDir.create(root, spec)
    for repeat in range(m.repeats):
        for b in m.backends:
            level = float(rng.lognormal(0.0, m.process_noise)) if m.process_noise else 1.0
            _write_job(rd.job(b.name, repeat), spec, m, b, rng, level)
    rd.set_status("complete")
    return rd.path


def _rank_factors(m: RunModel, b: BackendModel) -> np.ndarray:
    if m.world < 2 or not b.rank_skew:
        return np.ones((m.world, 1))
    return (1.0 + b.rank_skew * (2.0 * np.arange(m.world) / (m.world - 1) - 1.0))[:, None]


def _write_job(
    files: JobFiles, spec: RunSpec, m: RunModel, b: BackendModel, rng: np.random.Generator, level: float
) -> None:
    """One start of one backend's job: its env.json, job.json and a record per case."""
    files.write_env(
        [
            {
                "rank": r,
                "node": 0,
                "host": m.host,
                "gpu_name": m.gpu_name,
                "gpu_count": m.world,
                "sm_count": m.sm_count,
                "driver": m.driver,
                "cuda": "13.0",
                "nccl": m.nccl,
                "torch": m.torch,
                "python": "3.12.3",
                "moelab_version": "0.1.0",
                "moelab_git_sha": "abc1234",
                "library_versions": dict(b.library_versions),
                "env_vars": {"NCCL_NVLS_ENABLE": "0"},
            }
            for r in range(m.world)
        ]
    )
    if m.contended:
        files.write_contention([{"kind": "host-load", "subject": m.host, "reason": m.contended}])
    files.write_job(
        {
            "backend": b.name,
            "returncode": 0,
            "signal": None,
            "timed_out": False,
            "duration_s": 12.5,
            "failed_ranks": [],
            "stderr_tails": {},
            "argv": [],
            "description": "ok",
        }
    )
    for case in spec.cases_for(b.name):
        wl = case.workload
        rows = tuple(RankRows(**r) for r in _rows(wl.tokens_per_rank, wl.topk, m.world, wl.experts_per_rank))
        bpr = payload_bytes_per_token(wl.hidden, wl.dtype)
        where = {"world": m.world, "gpus_per_node": m.world}
        check = CheckResult(dispatch_err=0.0, combine_err=0.001)
        if b.name in m.incorrect:
            files.append_result(
                CaseRecord(
                    case=case,
                    status="incorrect",
                    reason="rank 0 dispatch: 3 rows differ",
                    check=check,
                    world=m.world,
                    gpus_per_node=m.world,
                )
            )
            continue
        sms = case.sms or m.sm_count
        gbps = b.peak_gbps * min(1.0, sms / b.sat_sms) ** 0.8
        ops = []
        for op, mult, n in (("dispatch", 1.0, m.iters), ("combine", 1.0, m.iters), ("roundtrip", 2.0, 5)):
            nbytes = rows[0].recv_rows * bpr * mult
            t = (b.alpha_us + nbytes / (gbps * 1e3)) * m.slowdown * level
            samples = (t * _rank_factors(m, b) * rng.lognormal(0.0, m.noise, size=(m.world, n))).round(3)
            measured = OpMeasurement(
                op=op,
                samples_us=samples.tolist(),
                bytes_per_row=int(bpr * mult),
                noise=median_noise(samples.max(axis=0)),  # as the ranks store it (timing.py)
            )
            ops.append(op_result(measured, rows))
        files.append_result(
            CaseRecord(
                case=case,
                status="ok",
                check=check,
                ops=tuple(ops),
                rows=rows,  # type: ignore[arg-type]
                backend_record=_family_record(b.name),
                **where,
            )
        )


def _family_record(name: str) -> dict[str, str]:
    """What a real run stores of a built-in backend for its bound (Backend.case_record)."""
    from moelab.backends import registry

    if name not in registry.BUILTIN:
        return {}
    family = registry.load(name).dispatch_family
    return {"dispatch_family": family} if family else {}


def build_db(db_path: Path, root: Path, models: Sequence[RunModel]) -> list[str]:
    con = connect(db_path)
    try:
        return [ingest(con, write_run(root, m)) for m in models]
    finally:
        con.close()


def add_extras(db_path: Path, run_id: str, backend: str, hostile: str = "") -> None:
    """Rows ingest does not write yet (traces, case metrics, health, suspect flags), inserted directly."""
    con = connect(db_path)
    try:
        case_id = con.execute(
            "SELECT min(case_id) FROM cases WHERE run_id = ? AND backend = ? AND status = 'ok'",
            [run_id, backend],
        ).fetchone()[0]  # type: ignore[index]
        con.execute(
            "INSERT INTO traces VALUES (?, ?, ?, 0, 'torch', ?, 123456)",
            [run_id, backend, case_id, f"{backend}/traces/{case_id}.rank0.json"],
        )
        con.execute(
            "INSERT INTO case_metrics VALUES (?, ?, ?, 'layer_time', 812.5, 'us', ?)",
            [run_id, backend, case_id, f"one MoE layer forward {hostile}"],
        )
        findings = [
            {
                "host": "gpu-node-1",
                "subject": "GPU0",
                "check": "clocks",
                "status": "warn",
                "reason": f"SM clock throttled {hostile}",
                "source": "nvml",
            }
        ]
        con.execute(
            "INSERT INTO health (run_id, backend, phase, host, node, worst, findings, snapshot) "
            "VALUES (?, ?, 'before', 'gpu-node-1', 0, 'warn', ?, '{}')",
            [run_id, backend, json.dumps(findings)],
        )
        con.execute(
            "UPDATE cases SET suspect = true, suspect_reason = ? WHERE run_id = ? AND case_id = ?",
            [f"spread too wide {hostile}", run_id, case_id],
        )
    finally:
        con.close()
