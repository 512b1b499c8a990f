"""`moelab model`: the EP roofline of a topology and workload, and every published row against its bound."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from moelab.cli.common import DB_OPTION_HELP, PEAKS_OPTION_HELP, console, print_table, user_errors
from moelab.core.display import safe_text
from moelab.core.errors import MoelabError, SpecError
from moelab.core.workload import RoutingSpec, Workload
from moelab.model.bound import COMBINE_DTYPES, Bound, Estimate, Latency, estimate
from moelab.model.links import load_peaks
from moelab.model.published import check_row, load_rows
from moelab.model.topology import TopologyRequest, resolve
from moelab.model.traffic import FAMILIES, traffic

FAMILY_NAMES = {"flat": "flat", "hierarchical": "hierarchical", "low-latency": "low_latency"}
PANEL_TOPO, PANEL_WL = "Topology and links", "Workload"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFacts:
    run_id: str
    nodes: int
    gpus_per_node: int
    gpu: str | None
    measured_intra_gbps: float | None


def _run_facts(db: str | None, ref: str) -> RunFacts:
    from moelab.store.db import open_db, resolve_db_path
    from moelab.store.labels import resolve_run

    path = resolve_db_path(db)
    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        run_id = resolve_run(con, ref)
        nodes, gpn, world = con.execute(
            "SELECT nodes, gpus_per_node, world FROM runs WHERE run_id = ?", [run_id]
        ).fetchone()  # type: ignore[misc]
        gpu = con.execute("SELECT min(gpu_name) FROM environment WHERE run_id = ?", [run_id]).fetchone()
        peak = con.execute(
            "SELECT max(gbps) FROM measured_peaks WHERE run_id = ? AND name LIKE 'peer_copy_shift%'", [run_id]
        ).fetchone()
    gpn = gpn or world
    return RunFacts(
        run_id=run_id,
        nodes=max(1, (world or gpn) // gpn),
        gpus_per_node=gpn,
        gpu=gpu[0] if gpu else None,
        measured_intra_gbps=peak[0] if peak else None,
    )


def _families(text: str) -> tuple[str, ...]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return FAMILIES
    bad = [n for n in names if n not in FAMILY_NAMES]
    if bad or not names:
        raise SpecError(f"--family takes all or any of {', '.join(FAMILY_NAMES)}, got {text!r}")
    return tuple(FAMILY_NAMES[n] for n in names)


def _link_mb(b: Bound, link: str) -> float | None:
    """The slowest rank's MB on `link`, the busier direction."""
    found = [x.bytes for x in b.loads if x.link == link]
    return max(found) / 1e6 if found else None


def _print_estimate(est: Estimate, wl: Workload, combine: str) -> None:
    topo = est.topology
    nic = f", {topo.nics_per_node} x {topo.nic_name} per node" if topo.nic is not None else ""
    console.print(
        f"topology: {topo.nodes} node(s) x {topo.gpus_per_node} {topo.gpu} = {topo.world} ranks{nic}"
    )
    for link in topo.links():
        console.print(f"  {link.name}: {link.gbps:.1f} GB/s per GPU and direction ({link.source})")
    console.print(f"workload: {wl.label()}, combine {combine}; traffic: {est.traffic.method}")
    rows = [
        [
            b.family,
            b.op,
            b.time_us,
            b.bottleneck,
            b.latency_us,
            _link_mb(b, "nvlink"),
            _link_mb(b, "pcie"),
            _link_mb(b, "nic"),
            b.gbps("nvl_recv"),
            b.gbps("rdma_pairs"),
            b.gbps("ll_selections"),
        ]
        for b in est.bounds
    ]
    print_table(
        [
            "family",
            "op",
            "bound µs",
            "bottleneck",
            "latency µs",
            "nvlink MB",
            "pcie MB",
            "nic MB",
            "nvl_recv GB/s",
            "rdma_pairs GB/s",
            "ll_selections GB/s",
        ],
        rows,
        title="lower bound per family (MB: the slowest rank's, per direction)",
    )


def _check_published(json_out: bool, peaks: Path | None, latency: Latency) -> None:
    table = load_peaks(peaks)
    checked = [check_row(r, table, latency) for r in load_rows()]
    problems = [c.problem for c in checked if c.problem]
    if json_out:
        print(json.dumps({"ok": not problems, "rows": [c.to_dict() for c in checked]}, indent=2))
    else:
        rows = [
            [
                c.row.row_id,
                c.row.gbps,
                c.row.definition,
                c.bound_gbps,
                c.ratio,
                c.bound.bottleneck,
                c.row.reason or "",
            ]
            for c in checked
        ]
        print_table(
            [
                "row",
                "published GB/s",
                "definition",
                "bound GB/s",
                "published / bound",
                "bottleneck",
                "reason",
            ],
            rows,
            title="published figures against the bound of their own hardware",
        )
        for src in dict.fromkeys(
            f"{c.row.library} {c.row.title}: {c.row.source}; {c.row.version}" for c in checked
        ):
            console.print(f"source: {src}")
    if problems:  # a finding, not a user error: exit 1
        print(
            f"error: {len(problems)} published row(s) fail the model: {safe_text(problems[0])}",
            file=sys.stderr,
        )
        raise typer.Exit(1)


@user_errors
def model(
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", help="GPUs per node (default 8, or the run's)", rich_help_panel=PANEL_TOPO
    ),
    nodes: int | None = typer.Option(
        None, "--nodes", help="Nodes (default 1, or the run's)", rich_help_panel=PANEL_TOPO
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="GPU model in the link table (default H100, or the run's)",
        rich_help_panel=PANEL_TOPO,
    ),
    nic: str | None = typer.Option(
        None,
        "--nic",
        help="NIC model in the link table (default ConnectX-7 on several nodes)",
        rich_help_panel=PANEL_TOPO,
    ),
    nics_per_node: int | None = typer.Option(
        None,
        "--nics-per-node",
        help="NICs (rails) per node (default one per GPU)",
        rich_help_panel=PANEL_TOPO,
    ),
    nvlink_gbps: float | None = typer.Option(
        None,
        "--nvlink-gbps",
        help="NVLink GB/s per GPU and direction, instead of the table's",
        rich_help_panel=PANEL_TOPO,
    ),
    pcie_gbps: float | None = typer.Option(
        None,
        "--pcie-gbps",
        help="The GPU's PCIe GB/s per direction, instead of the table's",
        rich_help_panel=PANEL_TOPO,
    ),
    nic_gbps: float | None = typer.Option(
        None,
        "--nic-gbps",
        help="GB/s per NIC and direction, instead of the table's",
        rich_help_panel=PANEL_TOPO,
    ),
    pcie_only: bool = typer.Option(
        False,
        "--pcie-only",
        help="No NVLink: peers talk over PCIe, sharing it with the NIC",
        rich_help_panel=PANEL_TOPO,
    ),
    from_run: str | None = typer.Option(
        None,
        "--from-run",
        help="Topology, GPU and measured link peaks of a stored run (id or label)",
        rich_help_panel=PANEL_TOPO,
    ),
    peaks: Path | None = typer.Option(None, "--peaks", help=PEAKS_OPTION_HELP, rich_help_panel=PANEL_TOPO),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP, rich_help_panel=PANEL_TOPO),
    hidden: int = typer.Option(8192, "--hidden", help="Hidden size", rich_help_panel=PANEL_WL),
    tokens_per_rank: int = typer.Option(
        4096, "--tokens-per-rank", help="Tokens per rank", rich_help_panel=PANEL_WL
    ),
    topk: int = typer.Option(8, "--topk", help="Experts per token", rich_help_panel=PANEL_WL),
    experts_per_rank: int | None = typer.Option(
        None, "--experts-per-rank", help="Experts per rank (default 2)", rich_help_panel=PANEL_WL
    ),
    experts: int | None = typer.Option(
        None, "--experts", help="Total experts, instead of --experts-per-rank", rich_help_panel=PANEL_WL
    ),
    routing: str = typer.Option(
        "uniform", "--routing", help="uniform, zipf, hot or grouped", rich_help_panel=PANEL_WL
    ),
    seed: int = typer.Option(0, "--seed", help="Routing seed", rich_help_panel=PANEL_WL),
    zipf_s: float = typer.Option(1.2, "--zipf-s", help="zipf: skew exponent", rich_help_panel=PANEL_WL),
    hot_experts: int = typer.Option(
        1, "--hot-experts", help="hot: how many experts are hot", rich_help_panel=PANEL_WL
    ),
    hot_share: float = typer.Option(
        0.5, "--hot-share", help="hot: share of tokens whose first choice is hot", rich_help_panel=PANEL_WL
    ),
    group_ranks: int = typer.Option(
        8, "--group-ranks", help="grouped: ranks per expert group", rich_help_panel=PANEL_WL
    ),
    topk_groups: int = typer.Option(
        4, "--topk-groups", help="grouped: groups each token picks", rich_help_panel=PANEL_WL
    ),
    dtype: str = typer.Option(
        "bf16", "--dtype", help="Dispatch payload: bf16, fp8, mxfp8", rich_help_panel=PANEL_WL
    ),
    combine_dtype: str = typer.Option(
        "bf16", "--combine-dtype", help="Combine payload: bf16, fp8, mxfp8", rich_help_panel=PANEL_WL
    ),
    family: str = typer.Option("all", "--family", help="all, or any of flat, hierarchical, low-latency"),
    latency_us: float | None = typer.Option(
        None, "--latency-us", help="The latency term of every family, µs (default: per family, see README)"
    ),
    count: bool = typer.Option(
        False, "--count", help="Count uniform routing with the generator instead of its closed form"
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON"),
    check_published: bool = typer.Option(
        False,
        "--check-published",
        help="Hold every published row against the bound of its own hardware (exit 1 when one is above it, or under 0.5 without a reason)",
    ),
) -> None:
    """Compute the lower-bound dispatch and combine time of a topology and workload, per dispatch family, from the bytes each link carries.

    Example: moelab model --nodes 4 --gpus-per-node 8 --gpu H100 --nic ConnectX-7 --hidden 7168 --experts 256 --dtype fp8
    """
    if latency_us is not None and latency_us < 0:
        raise SpecError(f"--latency-us must be >= 0, got {latency_us}")
    latency = Latency(override_us=latency_us)
    if check_published:
        return _check_published(json_out, peaks, latency)
    if combine_dtype not in COMBINE_DTYPES:
        raise SpecError(
            f"unknown --combine-dtype {combine_dtype!r}: choose one of {', '.join(COMBINE_DTYPES)}"
        )
    facts = _run_facts(db, from_run) if from_run else None
    req = TopologyRequest(
        nodes=nodes or (facts.nodes if facts else 1),
        gpus_per_node=gpus_per_node or (facts.gpus_per_node if facts else 8),
        gpu=gpu or (facts.gpu if facts else None),
        nic=nic,
        nics_per_node=nics_per_node,
        nvlink_gbps=nvlink_gbps,
        pcie_gbps=pcie_gbps,
        nic_gbps=nic_gbps,
        pcie_only=pcie_only,
        measured_intra_gbps=facts.measured_intra_gbps if facts and not nvlink_gbps else None,
        measured_source=f"measured peer copy of run {facts.run_id}" if facts else "",
    )
    if facts and facts.measured_intra_gbps is None:
        console.print(f"run {facts.run_id} stored no measured peaks: link figures from the table")
    topology = resolve(req, load_peaks(peaks))
    wl = _workload(
        topology.world,
        hidden,
        tokens_per_rank,
        topk,
        experts_per_rank,
        experts,
        dtype,
        RoutingSpec(
            kind=routing,
            seed=seed,
            zipf_s=zipf_s,
            hot_experts=hot_experts,
            hot_share=hot_share,
            group_ranks=group_ranks,
            topk_groups=topk_groups,
        ),
    )
    tr = traffic(wl, topology.world, topology.gpus_per_node, counted=count)
    est = estimate(
        tr,
        topology,
        hidden=hidden,
        dtype=dtype,
        combine_dtype=combine_dtype,
        families=_families(family),
        latency=latency,
    )
    if json_out:
        print(json.dumps(_as_json(est, wl, combine_dtype), indent=2))
    else:
        _print_estimate(est, wl, combine_dtype)


def _workload(
    world: int,
    hidden: int,
    tokens: int,
    topk: int,
    epr: int | None,
    experts: int | None,
    dtype: str,
    routing: RoutingSpec,
) -> Workload:
    if epr is not None and experts is not None:
        raise SpecError("give --experts-per-rank or --experts, not both")
    if experts is not None:
        if experts < 1 or experts % world:
            raise SpecError(f"--experts {experts} does not divide over {world} ranks")
        epr = experts // world
    wl = Workload(
        hidden=hidden,
        tokens_per_rank=tokens,
        topk=topk,
        experts_per_rank=epr or 2,
        routing=routing,
        dtype=dtype,
    )
    wl.validate(world)
    return wl


def _as_json(est: Estimate, wl: Workload, combine: str) -> dict[str, Any]:
    tr = est.traffic
    return {
        "topology": est.topology.to_dict(),
        "workload": {**wl.to_dict(), "combine_dtype": combine, "label": wl.label()},
        "traffic": {
            "method": tr.method,
            "rows_per_rank_mean": {f: tr.mean(f) for f in tr.ranks[0].definitions},
        },
        "bounds": [b.to_dict() for b in est.bounds],
    }
