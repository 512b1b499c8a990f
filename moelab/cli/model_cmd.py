"""`moelab model`: the EP roofline of a topology and workload, and every published row against its bound."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from moelab.cli import options as opt
from moelab.cli.common import DB_OPTION_HELP, PEAKS_OPTION_HELP, console, print_table, user_errors
from moelab.core.display import safe_text
from moelab.core.errors import MoelabError, SpecError
from moelab.core.workload import ROUTING_KINDS, RoutingSpec, Workload
from moelab.model.bound import COMBINE_DTYPES, Bound, Estimate, Latency, estimate
from moelab.model.links import link_rate_problem, load_peaks
from moelab.model.published import LIMITERS, NIC_TIGHT, TableCheck, check_tables, load_rows
from moelab.model.topology import Topology, TopologyRequest, resolve
from moelab.model.traffic import FAMILIES, traffic

# the sizes `moelab model` takes: a world past MAX_WORLD is no machine built, and routing other than the
# uniform closed form is generated token by token (about 0.1 s per rank at 4096 tokens): past
# MAX_GENERATED_SELECTIONS (ranks x tokens per rank x topk) it ran for minutes with no output
MAX_WORLD = 65_536
MAX_GENERATED_SELECTIONS = 1 << 21
MAX_LATENCY_US = 1e6  # a second of latency per collective is a typo, not a network
DEFAULT_EXPERTS_PER_RANK = 2  # the reference workload's
FAMILY_NAMES = {"flat": "flat", "hierarchical": "hierarchical", "low-latency": "low_latency"}
PANEL_TOPO, PANEL_WL = "Topology and links", "Workload"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFacts:
    run_id: str
    nodes: int
    gpus_per_node: int
    gpu: str | None
    measured_intra_gbps: float | None
    workloads: tuple[Workload, ...]  # each distinct workload of its cases, in the order they ran


def _stored_workloads(con: Any, run_id: str) -> tuple[Workload, ...]:
    """The run's workloads as its cases stored them (measured cases first considered; all when none was)."""
    rows = con.execute(
        """SELECT hidden, tokens_per_rank, topk, experts_per_rank, routing_params, dtype
           FROM cases WHERE run_id = ?
           GROUP BY ALL ORDER BY bool_or(status = 'ok') DESC, min(rowid)""",
        [run_id],
    ).fetchall()
    out = []
    for hidden, tokens, topk, epr, routing, dtype in rows:
        wl = Workload.from_dict(
            {
                "hidden": hidden,
                "tokens_per_rank": tokens,
                "topk": topk,
                "experts_per_rank": epr,
                "routing": json.loads(routing) if routing else {},
                "dtype": dtype,
            }
        )
        if wl not in out:
            out.append(wl)
    return tuple(out)


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
            "SELECT max(gbps) FROM measured_peaks WHERE run_id = ? "
            "AND (name LIKE 'peer_copy_shift%' OR name = 'peer_exchange_all')",
            [run_id],
        ).fetchone()
        workloads = _stored_workloads(con, run_id)
    gpn = gpn or world
    return RunFacts(
        run_id=run_id,
        nodes=max(1, (world or gpn) // gpn),
        gpus_per_node=gpn,
        gpu=gpu[0] if gpu else None,
        measured_intra_gbps=peak[0] if peak else None,
        workloads=workloads,
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
    """Per published table: the rows that hold, their ratio range, the rows the model cannot express with
    the reason; exit 1 if any row beats its bound or breaks a rule of moelab.model.published."""
    table = load_peaks(peaks)
    tables = check_tables(load_rows(), table, latency)
    checked = [c for t in tables for c in t.checked]
    problems = [p for t in tables for p in t.problems]
    if not checked:  # a pass over nothing checked is no pass
        if json_out:
            print(strict_json({"ok": False, "tables": [], "rows": []}))
        print(
            "error: no published rows to check: the published tables are missing from this install",
            file=sys.stderr,
        )
        raise typer.Exit(1)
    if json_out:
        held = [c for t in tables for c in t.held]
        summary = {
            "tables": len(tables),
            "tables_with_held_rows": sum(1 for t in tables if t.held),
            "rows": len(checked) + sum(len(t.unexpressed) for t in tables),
            "rows_held": len(held),
            "rows_above_bound": sum(1 for c in checked if c.ratio > 1.0),
            "rows_unexpressed": sum(len(t.unexpressed) for t in tables),
            "nic_bound_rows": sum(1 for c in checked if c.nic_bound),
            "nic_bound_ratio_min": min((c.ratio for c in checked if c.nic_bound), default=None),
            "nic_bound_under_tight": [
                {"id": c.row.row_id, "ratio": c.ratio, "reason": c.row.reason}
                for c in checked
                if c.nic_bound and c.ratio < NIC_TIGHT
            ],
            "limited_elsewhere": {
                k: sum(1 for c in checked if c.limiter and c.limiter.kind == k) for k in LIMITERS
            },
        }
        doc = {
            "ok": not problems,
            "summary": summary,
            "tables": [t.to_dict() for t in tables],
            "rows": [c.to_dict() for c in checked],
        }
        print(strict_json(doc))
    else:
        _print_tables(tables)
    if problems:  # a finding, not a user error: exit 1
        print(
            f"error: {len(problems)} published row(s) fail the model: {safe_text(problems[0])}",
            file=sys.stderr,
        )
        raise typer.Exit(1)


def _print_tables(tables: list[TableCheck]) -> None:
    rows = []
    for t in tables:
        span = t.ratio_range()
        rows.append(
            [
                f"{t.dataset}/{t.table}",
                t.title,
                f"{len(t.held)} of {len(t.checked) + len(t.unexpressed)}",
                f"{span[0]:.2f}–{span[1]:.2f}" if span else "—",
                len(t.unexpressed),
            ]
        )
    print_table(
        ["table", "title", "rows that hold", "published / bound", "cannot express"],
        rows,
        title="published tables against the bound of their own hardware",
    )
    print_table(
        [
            "row",
            "published GB/s",
            "definition",
            "bound GB/s",
            "published / bound",
            "bottleneck",
            "limited by, reason",
        ],
        [
            [
                c.row.row_id,
                c.row.gbps,
                c.row.definition,
                c.bound_gbps,
                c.ratio,
                c.bottleneck,
                "; ".join(x for x in (c.limiter.text if c.limiter else "", c.row.reason or "") if x),
            ]
            for t in tables
            for c in t.checked
        ],
        title="every row",
    )
    for t in tables:
        for r in t.unexpressed:
            console.print(f"cannot express {r.row_id}: {r.unexpressed}")
    for t in tables:
        console.print(f"source of {t.dataset}/{t.table}: {t.source}")


@dataclass(frozen=True, kw_only=True)
class TopologyOptions(opt.Options):
    gpus_per_node: int | None = None
    nodes: int | None = None
    gpu: str | None = None
    nic: str | None = None
    nics_per_node: int | None = None
    nvlink_gbps: float | None = None
    pcie_gbps: float | None = None
    nic_gbps: float | None = None
    pcie_only: bool = False
    from_run: str | None = None
    peaks: Path | None = None
    db: str | None = None

    def run_facts(self) -> RunFacts | None:
        """The stored run of --from-run, or None."""
        return _run_facts(self.db, self.from_run) if self.from_run else None

    def topology(self, facts: RunFacts | None) -> Topology:
        """The topology these flags describe; a stored run (--from-run: `facts`) fills what they leave out."""
        req = TopologyRequest(
            nodes=self.nodes or (facts.nodes if facts else 1),
            gpus_per_node=self.gpus_per_node or (facts.gpus_per_node if facts else 8),
            gpu=self.gpu or (facts.gpu if facts else None),
            nic=self.nic,
            nics_per_node=self.nics_per_node,
            nvlink_gbps=self.nvlink_gbps,
            pcie_gbps=self.pcie_gbps,
            nic_gbps=self.nic_gbps,
            pcie_only=self.pcie_only,
            measured_intra_gbps=facts.measured_intra_gbps if facts and not self.nvlink_gbps else None,
            measured_source=f"measured link capacity of run {facts.run_id}" if facts else "",
        )
        if facts and facts.measured_intra_gbps is None:  # a note, on stderr: --json's stdout stays JSON
            print(
                f"run {facts.run_id} stored no measured peaks: link figures from the table", file=sys.stderr
            )
        return resolve(req, load_peaks(self.peaks))


@dataclass(frozen=True, kw_only=True)
class ModelWorkloadOptions(opt.Options):
    """The workload flags; one left out is the stored run's (--from-run), else Workload's default."""

    hidden: int | None = None
    tokens_per_rank: int | None = None
    topk: int | None = None
    experts_per_rank: int | None = None
    experts: int | None = None
    routing: str | None = None
    seed: int = 0
    zipf_s: float = 1.2
    hot_experts: int = 1
    hot_share: float = 0.5
    group_ranks: int = 8
    topk_groups: int = 4
    dtype: str | None = None
    combine_dtype: str = "bf16"

    def check_combine_dtype(self) -> None:
        if self.combine_dtype not in COMBINE_DTYPES:
            raise SpecError(
                f"unknown --combine-dtype {self.combine_dtype!r}: choose one of {', '.join(COMBINE_DTYPES)}"
            )

    def workload(self, world: int, stored: Workload | None = None) -> Workload:
        """One workload over `world` ranks: these flags over the `stored` run's workload (or Workload's
        defaults); --experts must divide over the ranks."""
        base = stored or Workload()
        epr, experts = self.experts_per_rank, self.experts
        if epr is not None and experts is not None:
            raise SpecError("give --experts-per-rank or --experts, not both")
        if experts is not None:
            if experts < 1 or experts % world:
                raise SpecError(f"--experts {experts} does not divide over {world} ranks")
            epr = experts // world
        topk = base.topk if self.topk is None else self.topk
        if epr is None and stored is None and DEFAULT_EXPERTS_PER_RANK * world < topk:
            # moelab run's rule for the same case (a 2-rank topology): the nearest variant
            from moelab.plan.planning import NEAREST_EXPERTS_PER_RANK  # planning imports torch: not at start

            epr = max(NEAREST_EXPERTS_PER_RANK, -(-topk // world))
            print(
                f"note: {DEFAULT_EXPERTS_PER_RANK} experts/rank x {world} ranks < topk {topk}: using the "
                f"nearest variant, {epr} experts/rank, as moelab run does; set --experts-per-rank to choose",
                file=sys.stderr,
            )
        routing = base.routing
        if self.routing is not None or stored is None:
            routing = RoutingSpec(
                kind=self.routing or "uniform",
                seed=self.seed,
                zipf_s=self.zipf_s,
                hot_experts=self.hot_experts,
                hot_share=self.hot_share,
                group_ranks=self.group_ranks,
                topk_groups=self.topk_groups,
            )
        wl = Workload(
            hidden=base.hidden if self.hidden is None else self.hidden,
            tokens_per_rank=base.tokens_per_rank if self.tokens_per_rank is None else self.tokens_per_rank,
            topk=topk,
            experts_per_rank=base.experts_per_rank if epr is None else epr,
            routing=routing,
            dtype=self.dtype or base.dtype,
        )
        wl.validate(world)
        return wl


def _group_flags(
    group: type[opt.Options] | None, panel: str | None, *specs: tuple[str, Any, Any, str, str]
) -> list[opt.Flag]:
    return [
        opt.Flag(name, kind, default, (decl,), text, panel, group)
        for name, kind, default, decl, text in specs
    ]


TOPOLOGY_FLAGS = _group_flags(
    TopologyOptions,
    PANEL_TOPO,
    ("gpus_per_node", int | None, None, "--gpus-per-node", "GPUs per node (default 8, or the run's)"),
    ("nodes", int | None, None, "--nodes", "Nodes (default 1, or the run's)"),
    ("gpu", str | None, None, "--gpu", "GPU model in the link table (default H100, or the run's)"),
    ("nic", str | None, None, "--nic", "NIC model in the link table (default ConnectX-7 on several nodes)"),
    ("nics_per_node", int | None, None, "--nics-per-node", "NICs (rails) per node (default one per GPU)"),
    (
        "nvlink_gbps",
        float | None,
        None,
        "--nvlink-gbps",
        "NVLink GB/s per GPU and direction, instead of the table's",
    ),
    (
        "pcie_gbps",
        float | None,
        None,
        "--pcie-gbps",
        "The GPU's PCIe GB/s per direction, instead of the table's",
    ),
    ("nic_gbps", float | None, None, "--nic-gbps", "GB/s per NIC and direction, instead of the table's"),
    ("pcie_only", bool, False, "--pcie-only", "No NVLink: peers talk over PCIe, sharing it with the NIC"),
    (
        "from_run",
        str | None,
        None,
        "--from-run",
        "Topology, GPU and measured link peaks of a stored run (id or label)",
    ),
    ("peaks", Path | None, None, "--peaks", PEAKS_OPTION_HELP),
    ("db", str | None, None, "--db", DB_OPTION_HELP),
)
MODEL_WORKLOAD_FLAGS = _group_flags(
    ModelWorkloadOptions,
    PANEL_WL,
    ("hidden", int | None, None, "--hidden", "Hidden size (default 8192, or the run's)"),
    (
        "tokens_per_rank",
        int | None,
        None,
        "--tokens-per-rank",
        "Tokens per rank (default 4096, or the run's)",
    ),
    ("topk", int | None, None, "--topk", "Experts per token (default 8, or the run's)"),
    (
        "experts_per_rank",
        int | None,
        None,
        "--experts-per-rank",
        "Experts per rank (default 2, or the run's)",
    ),
    ("experts", int | None, None, "--experts", "Total experts, instead of --experts-per-rank"),
    (
        "routing",
        str | None,
        None,
        "--routing",
        f"{', '.join(ROUTING_KINDS)} (default uniform, or the run's routing with its parameters)",
    ),
    ("seed", int, 0, "--seed", "Routing seed"),
    ("zipf_s", float, 1.2, "--zipf-s", "zipf: skew exponent"),
    ("hot_experts", int, 1, "--hot-experts", "hot: how many experts are hot"),
    ("hot_share", float, 0.5, "--hot-share", "hot: share of tokens whose first choice is hot"),
    ("group_ranks", int, 8, "--group-ranks", "grouped: ranks per expert group"),
    ("topk_groups", int, 4, "--topk-groups", "grouped: groups each token picks"),
    ("dtype", str | None, None, "--dtype", "Dispatch payload: bf16, fp8, mxfp8 (default bf16, or the run's)"),
    ("combine_dtype", str, "bf16", "--combine-dtype", "Combine payload: bf16, fp8, mxfp8"),
)
MODEL_FLAGS = _group_flags(
    None,
    None,
    ("family", str, "all", "--family", "all, or any of flat, hierarchical, low-latency"),
    (
        "latency_us",
        float | None,
        None,
        "--latency-us",
        "The latency term of every family, µs (default: per family, see README)",
    ),
    ("count", bool, False, "--count", "Count uniform routing with the generator instead of its closed form"),
    ("json_out", bool, False, "--json", "Print the result as JSON"),
    (
        "check_published",
        bool,
        False,
        "--check-published",
        "Hold every published row against the bound of its own hardware (exit 1 when one is above it, or "
        "under 0.5 without a reason)",
    ),
)


@user_errors
@opt.command(*TOPOLOGY_FLAGS, *MODEL_WORKLOAD_FLAGS, *MODEL_FLAGS)
def model(
    topo: TopologyOptions,
    workload: ModelWorkloadOptions,
    family: str,
    latency_us: float | None,
    count: bool,
    json_out: bool,
    check_published: bool,
) -> None:
    """Compute the lower-bound dispatch and combine time of a topology and workload, per dispatch family, from the bytes each link carries.

    Example: moelab model --nodes 4 --gpus-per-node 8 --gpu H100 --nic ConnectX-7 --hidden 7168 --experts 256 --dtype fp8
    """
    check_model_inputs(topo, workload, latency_us)
    latency = Latency(override_us=latency_us)
    if check_published:
        unread = _given(topo, keep=("peaks",)) + _given(workload) + (["--family"] if family != "all" else [])
        if unread or count:
            raise SpecError(
                f"--check-published holds each published row against its own hardware and workload: "
                f"{', '.join(unread + (['--count'] if count else []))} would be ignored; give none of them"
            )
        return _check_published(json_out, topo.peaks, latency)
    workload.check_combine_dtype()
    facts = topo.run_facts()
    topology = topo.topology(facts)
    stored = facts.workloads[0] if facts and facts.workloads else None
    wl = workload.workload(topology.world, stored)
    _check_routing_flags(wl, workload, count)
    _check_generated_size(wl, topology.world, count)
    if facts and len(facts.workloads) > 1:  # a note, on stderr: --json's stdout stays JSON
        print(
            f"run {facts.run_id} has {len(facts.workloads)} workloads: modelled its first, {stored.label() if stored else ''}"
            " (flags choose another)",
            file=sys.stderr,
        )
    tr = traffic(wl, topology.world, topology.gpus_per_node, counted=count)
    est = estimate(
        tr,
        topology,
        hidden=wl.hidden,
        dtype=wl.dtype,
        combine_dtype=workload.combine_dtype,
        families=_families(family),
        latency=latency,
    )
    if json_out:
        print(strict_json(_as_json(est, wl, workload.combine_dtype)))
    else:
        _print_estimate(est, wl, workload.combine_dtype)


def check_model_inputs(
    topo: TopologyOptions, workload: ModelWorkloadOptions, latency_us: float | None
) -> None:
    """Every count at least 1 and every figure a finite number, before anything is modelled: `--nodes 0` was
    modelled as one node, `--experts-per-rank 0` as two, and an `inf` link speed printed `inf` bounds."""
    counts = {
        "--nodes": topo.nodes,
        "--gpus-per-node": topo.gpus_per_node,
        "--nics-per-node": topo.nics_per_node,
        "--experts-per-rank": workload.experts_per_rank,
        "--experts": workload.experts,
    }
    for flag, value in counts.items():
        if value is not None and value < 1:
            raise SpecError(f"{flag} must be at least 1, got {value}")
    world = (topo.nodes or 1) * (topo.gpus_per_node or 8)
    if world > MAX_WORLD:
        raise SpecError(
            f"--nodes x --gpus-per-node = {world:,} ranks is above the largest modelled, {MAX_WORLD:,}"
        )
    figures = {
        "--nvlink-gbps": topo.nvlink_gbps,
        "--pcie-gbps": topo.pcie_gbps,
        "--nic-gbps": topo.nic_gbps,
        "--latency-us": latency_us,
        "--zipf-s": workload.zipf_s,
        "--hot-share": workload.hot_share,
    }
    for flag, figure in figures.items():
        if figure is not None and not math.isfinite(figure):
            raise SpecError(f"{flag} must be a finite number, got {figure}")
    for flag in ("--nvlink-gbps", "--pcie-gbps", "--nic-gbps"):
        if (speed := figures[flag]) is not None and (problem := link_rate_problem(speed)):
            raise SpecError(f"{flag} {problem}")
    if latency_us is not None and not 0 <= latency_us <= MAX_LATENCY_US:
        raise SpecError(f"--latency-us must be between 0 and {MAX_LATENCY_US:,.0f} µs, got {latency_us:g}")


def _given(options: TopologyOptions | ModelWorkloadOptions, keep: tuple[str, ...] = ()) -> list[str]:
    """The flags of `options` set away from their defaults, by flag name (`--from-run`)."""
    return [
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(options)
        if f.name not in keep and getattr(options, f.name) != f.default
    ]


# the routing each parameter shapes; given for another routing it would be ignored without a word
ROUTING_PARAMS = {
    "--zipf-s": "zipf",
    "--hot-experts": "hot",
    "--hot-share": "hot",
    "--group-ranks": "grouped",
    "--topk-groups": "grouped",
}


def _check_routing_flags(wl: Workload, workload: ModelWorkloadOptions, count: bool) -> None:
    kind, given = wl.routing.kind, set(_given(workload))
    for flag, owner in ROUTING_PARAMS.items():
        if flag in given and owner != kind:
            raise SpecError(
                f"{flag} shapes {owner} routing; this model's routing is {kind}: give --routing {owner}"
            )
    if count and kind != "uniform":
        raise SpecError(f"--count counts uniform routing token by token; {kind} routing is always counted so")
    if kind == "uniform" and not count and "--seed" in given:
        raise SpecError(
            "--seed: uniform routing is modelled by its closed form, which draws nothing: add --count"
        )


def _check_generated_size(wl: Workload, world: int, counted: bool) -> None:
    if wl.routing.kind == "uniform" and not counted:
        return  # the closed form: no token is generated
    selections = world * wl.tokens_per_rank * wl.topk
    if selections > MAX_GENERATED_SELECTIONS:
        raise SpecError(
            f"{wl.routing.kind} routing is generated token by token: {world:,} ranks x {wl.tokens_per_rank:,} "
            f"tokens x topk {wl.topk} = {selections:,} choices is above the {MAX_GENERATED_SELECTIONS:,} moelab "
            "model generates; model fewer ranks or tokens per rank (the bound is per rank)"
        )


def strict_json(doc: Any) -> str:
    """`doc` as JSON that strict parsers read: a non-finite figure (no bound on that link) becomes null,
    never `Infinity` or `NaN`."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(doc), indent=2, allow_nan=False)


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
