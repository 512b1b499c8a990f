"""The bound of a stored case: its own workload and topology (ranks, GPUs per node, the GPU it recorded),
its backend's dispatch family, and link figures from the run's measured peaks where it stored them (one
node: the larger of the measured link capacity, pair by pair or with every peer at once, and the named
table's rate is the intra-node link), else the named table.

Reports, `moelab run` and `moelab compare` call `case_bound` with the stored columns; it needs no torch
for uniform routing (closed form) and counts other routings with moelab's generator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from moelab.core.errors import MoelabError
from moelab.core.workload import RoutingSpec, Workload
from moelab.model.bound import Estimate, Latency, estimate, stored_time_bound
from moelab.model.links import PeakTable
from moelab.model.topology import TopologyRequest, resolve
from moelab.model.traffic import FAMILIES, traffic


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseBound:
    time_us: float
    family: str
    links: str  # where the link figures come from
    bottleneck: str
    nodes: int = 1  # the nodes the bound assumed (their NIC between them)
    nic: str | None = None
    intra_measured: bool = False  # the intra-node figure is the run's measured one (above the table's)


def case_workload(case: Mapping[str, Any]) -> Workload:
    params = case.get("routing_params")
    params = json.loads(params) if isinstance(params, str) else dict(params or {})
    params.setdefault("kind", case.get("routing", "uniform"))
    params.setdefault("seed", case.get("routing_seed", 0))
    known = set(RoutingSpec.__dataclass_fields__)
    return Workload(
        hidden=case["hidden"],
        tokens_per_rank=case["tokens_per_rank"],
        topk=case["topk"],
        experts_per_rank=case["experts_per_rank"],
        dtype=case["dtype"],
        routing=RoutingSpec(**{k: v for k, v in params.items() if k in known}),
    )


@lru_cache(maxsize=256)
def _estimate(
    workload: Workload,
    world: int,
    gpus_per_node: int,
    gpu: str,
    measured: float | None,
    run_id: str,
    combine: str,
    table: PeakTable,
) -> Estimate:
    nodes = max(1, world // gpus_per_node)
    req = TopologyRequest(
        nodes=nodes,
        gpus_per_node=world // nodes,
        gpu=gpu,
        measured_intra_gbps=measured if nodes == 1 else None,
        measured_source=f"measured link capacity of run {run_id} (moelab.measure.peaks)",
    )
    topology = resolve(req, table)
    tr = traffic(workload, world, topology.gpus_per_node)
    return estimate(
        tr, topology, hidden=workload.hidden, dtype=workload.dtype, combine_dtype=combine, latency=Latency()
    )


def workload_bound(
    workload: Workload,
    family: str | None,
    combine: str,
    op: str,
    world: int,
    gpus_per_node: int,
    gpu: str,
    table: PeakTable,
    measured_intra_gbps: float | None = None,
    run_id: str = "",
) -> CaseBound | None:
    """The lower-bound time of `op` for a case of `workload` on `world` ranks by a backend of dispatch
    `family` (None: unknown, the fastest family) with a `combine` payload; None where there is none (a GPU
    the table does not know, an op that moves no payload, a workload that cannot run there)."""
    if table.gpu(gpu) is None or op == "layout" or world % gpus_per_node:
        return None
    try:
        est = _estimate(
            workload,
            world,
            gpus_per_node,
            gpu,
            measured_intra_gbps,
            run_id,
            combine,
            table,
        )
    except (MoelabError, ValueError):
        return None
    times = {f: stored_time_bound(est, f, op) for f in ([family] if family else FAMILIES)}
    known = {f: t for f, t in times.items() if t is not None}
    if not known:
        return None
    best = min(known, key=lambda f: known[f])
    links = "; ".join(f"{k.name} {k.gbps:.0f} GB/s: {k.source}" for k in est.topology.links())
    bottleneck = est.get(best, "combine" if op == "combine" else "dispatch").bottleneck
    return CaseBound(
        time_us=known[best],
        family=best if family else f"{best} (fastest family)",
        links=links,
        bottleneck=bottleneck,
        nodes=est.topology.nodes,
        nic=est.topology.nic_name,
        intra_measured=measured_intra_gbps is not None
        and est.topology.intra.gbps == measured_intra_gbps
        and est.topology.nodes == 1,
    )


def case_bound(
    case: Mapping[str, Any],
    op: str,
    gpu: str | None,
    measured_intra_gbps: float | None,
    table: PeakTable,
    traits: tuple[str | None, str] = (None, "bf16"),
) -> CaseBound | None:
    """`workload_bound` of one stored op (a row of moelab.reports.query.results) by a backend of `traits`
    (dispatch family, combine payload: moelab.backends.registry.bound_traits); None for a CPU run."""
    if not gpu:
        return None
    try:
        workload = case_workload(case)
    except (MoelabError, ValueError, TypeError, KeyError):
        return None
    world = int(case["world"])
    return workload_bound(
        workload,
        *traits,
        op,
        world,
        int(case.get("gpus_per_node") or world),
        gpu,
        table,
        measured_intra_gbps,
        str(case.get("run_id", "")),
    )
