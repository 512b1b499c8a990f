"""Every measured op against moelab model's lower bound for its own case and topology, and every case that
matches a published row beside that row.

`annotate_bounds` adds to each result row (moelab.reports.query.results): `bound_us`, the op's bound time;
`frac_bound`, bound / measured time (the same in any byte definition); `bound_family` and `bound_links`,
which family and link figures gave it (the run's measured link capacity where it is above the named
table). `moelab run`, the report and `moelab compare` read these fields.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from moelab.core.workload import PAYLOAD_DTYPES, RoutingSpec, payload_bytes_per_token
from moelab.model.bound import bytes_per_row
from moelab.model.links import LinkPeak, PeakTable
from moelab.model.published import PublishedRow, load_rows
from moelab.model.stored import case_bound
from moelab.reports import hardware
from moelab.reports.analysis import fraction_of_peak
from moelab.reports.hardware import JobLinks

BOUND_NOTE = (
    "% bound: moelab model's lower-bound time for the case's own ranks, GPUs per node, workload and backend "
    "family over the measured time (100% = at the bound; the same in any byte definition)."
)


def gpu_by_run_backend(environment: Sequence[dict[str, Any]]) -> dict[tuple[str, str], str | None]:
    out: dict[tuple[str, str], str | None] = {}
    for e in sorted(environment, key=lambda e: (e["rank"] is None, e["rank"])):
        out.setdefault((e["run_id"], e["backend"]), e.get("gpu_name"))
    return out


def hosts_by_run_backend(environment: Sequence[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """How many distinct hosts each job's ranks ran on (a bound of more nodes than that assumed a NIC the
    host lacks)."""
    seen: dict[tuple[str, str], set[str]] = {}
    for e in environment:
        if e.get("host"):
            seen.setdefault((e["run_id"], e["backend"]), set()).add(e["host"])
    return {job: len(h) for job, h in seen.items()}


def annotate_bounds(
    results: list[dict[str, Any]],
    environment: Sequence[dict[str, Any]],
    table: PeakTable,
    links: JobLinks | None = None,
) -> None:
    """`links`: each job's link as its machine reported it (hardware.job_links); where NVML reported one,
    the bound takes it instead of the datasheet of the GPU's name (a measured link capacity above it still comes first).
    One rank moves nothing over a link: it gets no bound."""
    gpus = gpu_by_run_backend(environment)
    hosts = hosts_by_run_backend(environment)
    combine_bytes = {_case_key(r): r["bytes_per_row"] for r in results if r["op"] == "combine"}
    tables: dict[tuple[str, str], PeakTable] = {}
    for r in results:
        combine = stored_combine_dtype(r["hidden"], combine_bytes.get(_case_key(r)))
        traits = (r.get("dispatch_family"), combine)  # a run before the family was stored: the fastest
        job = (r["run_id"], r["backend"])
        gpu = gpus.get(job)
        if job not in tables:
            tables[job] = reported_table(table, gpu, links.get(*job) if links else None)
        peer = r.get("measured_peer_peak_gbps")
        b = None if r["world"] == 1 else case_bound(r, r["op"], gpu, peer, tables[job], traits)
        r["bound_us"] = b.time_us if b else None
        r["bound_family"] = b.family if b else None
        r["bound_links"] = b.links if b else None
        r["frac_bound"] = fraction_of_peak(b.time_us, r["median_us"]) if b else None
        r["bound_nodes"] = b.nodes if b else None  # what the bound assumed, against the hosts the run used
        r["bound_nic"] = b.nic if b else None
        r["bound_intra_measured"] = b.intra_measured if b else None
        r["hosts"] = hosts.get(job)


def reported_table(table: PeakTable, gpu: str | None, peak: LinkPeak | None) -> PeakTable:
    """`table` with the job's reported link first for its GPU (its full name is the longest pattern)."""
    if gpu is None or peak is None or hardware.basis(peak) != "NVML":
        return table
    entry = replace(peak, pattern=gpu)
    return replace(table, gpus=(entry, *table.gpus))


def _case_key(r: dict[str, Any]) -> tuple[str, str, str]:
    return (r["run_id"], r["backend"], r["case_id"])


def stored_combine_dtype(hidden: int, combine_bytes_per_row: int | None) -> str:
    """Combine's payload type, read off the bytes a combine row carried (stored for every case, old runs
    too); bf16 when the case stored no combine."""
    for dtype in PAYLOAD_DTYPES:
        if combine_bytes_per_row == payload_bytes_per_token(hidden, dtype):
            return dtype
    return "bf16"


def bound_sources(results: Sequence[dict[str, Any]]) -> list[str]:
    """Each distinct set of link figures the bounds used, once."""
    return list(dict.fromkeys(f"{r['run_id']}: {r['bound_links']}" for r in results if r.get("bound_links")))


def _routing_key(spec: RoutingSpec, world: int) -> tuple[Any, ...]:
    """What a routing is at `world` ranks, seed aside: grouped routing that keeps every group is uniform."""
    if spec.kind == "grouped":
        if world % spec.group_ranks or spec.groups_per_token(world) >= spec.groups(world):
            return ("uniform",)
        return ("grouped", spec.group_ranks, spec.groups_per_token(world))
    if spec.kind == "zipf":
        return ("zipf", spec.zipf_s)
    if spec.kind == "hot":
        return ("hot", spec.hot_experts, spec.hot_share)
    return (spec.kind,)


def _routing_of(r: dict[str, Any]) -> RoutingSpec:
    params = r.get("routing_params") or {}
    params = json.loads(params) if isinstance(params, str) else dict(params)
    known = {k: v for k, v in params.items() if k in RoutingSpec.__dataclass_fields__ and k != "kind"}
    return RoutingSpec(**{**known, "kind": r["routing"]})


def _matches(row: PublishedRow, r: dict[str, Any]) -> bool:
    """A row that names its SM count matches a case at that count; one timed kernel-only is not beside an
    op timed through the library's API."""
    wl = row.workload
    if (
        wl is None
        or row.timing not in (None, "torch-api")
        or (row.sms is not None and r.get("sms") != row.sms)
    ):
        return False
    return (
        r["backend"] in row.backends
        and r["op"] in ((row.op,) if row.op == "combine" else ("dispatch",))
        and r["world"] == row.ep
        and r["hidden"] == wl.hidden
        and r["tokens_per_rank"] == wl.tokens_per_rank
        and r["topk"] == wl.topk
        and r["experts_per_rank"] * r["world"] == wl.experts_at(row.ep)
        and r["dtype"] == wl.dtype
        and _routing_key(_routing_of(r), row.ep) == _routing_key(wl.routing, row.ep)
    )


def published_for(r: dict[str, Any]) -> list[PublishedRow]:
    """The published rows a case's op matches (r: backend, op, world, hidden, tokens_per_rank, topk,
    experts_per_rank, dtype, routing and, where given, routing_params)."""
    return [p for p in load_rows() if _matches(p, r)]


def published_beside(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured op that matches a published row: the published figure and its source, the measured one
    in the same definition, and the bound on the run's own topology in that definition."""
    rows = load_rows()
    out = []
    for r in results:
        for p in rows:
            if p.gbps is None or not _matches(p, r):  # a published time alone has no bandwidth to set beside
                continue
            measured = _measured_gbps(p, r)
            bound = measured / r["frac_bound"] if measured is not None and r.get("frac_bound") else None
            out.append(
                {
                    "run_id": r["run_id"],
                    "backend": r["backend"],
                    "case_id": r["case_id"],
                    "op": r["op"],
                    "row_id": p.row_id,
                    "definition": p.definition,
                    "published_gbps": p.gbps,
                    "measured_gbps": measured,
                    "bound_gbps": bound,
                    "vs_published": fraction_of_peak(measured, p.gbps),
                    "frac_bound": r.get("frac_bound"),
                    "source": f"{p.source}; {p.version}",
                    "hardware": p.hardware_text,
                }
            )
    return out


def _measured_gbps(row: PublishedRow, r: dict[str, Any]) -> float | None:
    stored = {
        "nvl_recv": r.get("nvl_gbps"),
        "nvl_remote": r.get("remote_gbps"),
        "rdma_pairs": r.get("rdma_gbps"),
        "rdma_remote": r.get("rdma_remote_gbps"),
    }
    if row.definition in stored:
        return stored[row.definition]
    if row.definition == "ll_selections" and r["median_us"] and row.workload is not None:
        wl = row.workload
        per_message = bytes_per_row("low_latency", row.op, wl.hidden, wl.dtype, wl.combine_dtype)
        return r["tokens_per_rank"] * r["topk"] * per_message / (r["median_us"] * 1e3)
    return None
