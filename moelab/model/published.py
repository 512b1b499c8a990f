"""Published EP figures as data (moelab/model/published_tables/*.toml), each row with its source, hardware and
workload, and each row held against the bound of its own hardware.

A row's figure is a bandwidth in a named byte definition (moelab.core.definitions: `nvl_recv` is DeepEP's
"NVL", `rdma_pairs` its "RDMA", `ll_selections` its low-latency bytes); the bound in that definition is
the definition's bytes over the bound time, so published / bound is the bound time over the published
time whatever the definition. A row above 1.0 is a modelling error (a byte definition that differs, own
traffic counted where it crosses no link) and fails the check; a row under 0.5 must say why in `reason`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from moelab.core.errors import MoelabError
from moelab.core.workload import RoutingSpec, Workload
from moelab.model.bound import DEFINITION_ROWS, OPS, Bound, Latency, estimate
from moelab.model.links import PeakTable
from moelab.model.topology import TopologyRequest, resolve
from moelab.model.traffic import FAMILIES, Traffic, traffic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOW_RATIO = 0.5  # under this a row must carry its reason
ROUTING_FIELDS = ("routing", "seed", "group_ranks", "topk_groups", "zipf_s", "hot_experts", "hot_share")
TABLE_KEYS = {
    "title",
    "document",
    "commit",
    "date",
    "history",
    "family",
    "backends",
    "figure",
    "test",
    "workload",
    "workload_text",
}
DATASET_KEYS = {
    "library",
    "version",
    "repository",
    "hardware_text",
    "gpu",
    "nic",
    "gpus_per_node",
    "nics_per_node",
}
ROW_KEYS = {"table", "ep", "op", "gbps", "definition", "time_us", "reason"}


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedWorkload:
    hidden: int
    tokens_per_rank: int
    topk: int
    experts: int
    dtype: str
    combine_dtype: str
    routing: RoutingSpec

    def workload(self, world: int) -> Workload:
        if self.experts % world:
            raise MoelabError(f"{self.experts} experts do not divide over EP{world}")
        return Workload(
            hidden=self.hidden,
            tokens_per_rank=self.tokens_per_rank,
            topk=self.topk,
            experts_per_rank=self.experts // world,
            routing=self.routing,
            dtype=self.dtype,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRow:
    dataset: str  # file stem
    library: str
    version: str
    table: str
    title: str
    document: str
    commit: str
    date: str
    repository: str
    test: str
    family: str
    backends: tuple[str, ...]
    hardware_text: str
    gpu: str
    nic: str
    gpus_per_node: int
    nics_per_node: int
    workload: PublishedWorkload
    ep: int
    op: str
    gbps: float
    definition: str
    time_us: float | None
    reason: str | None

    @property
    def row_id(self) -> str:
        return f"{self.dataset}/{self.table}/ep{self.ep}/{self.op}"

    @property
    def source(self) -> str:
        return f"{self.library} {self.document} at {self.commit[:7]} ({self.date}), {self.repository}"

    @property
    def nodes(self) -> int:
        return max(1, self.ep // self.gpus_per_node)


def dataset_paths() -> dict[str, Path]:
    folder = resources.files("moelab.model") / "published_tables"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".toml")}


def load_rows(paths: dict[str, Path] | None = None) -> list[PublishedRow]:
    out = []
    for name, path in sorted((paths or dataset_paths()).items()):
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise MoelabError(f"cannot read published dataset {path}: {exc}") from exc
        out += parse_dataset(name, doc, str(path))
    return out


def _keys(where: str, table: Any, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise MoelabError(f"{where} must be a table")
    unknown, missing = set(table) - allowed, required - set(table)
    if unknown or missing:
        raise MoelabError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    return table


def _workload(where: str, w: dict[str, Any]) -> PublishedWorkload:
    routing = {k: w[k] for k in ROUTING_FIELDS if k in w}
    kind = routing.pop("routing", "uniform")
    try:
        spec = RoutingSpec(kind=kind, **routing)
        spec.validate()
        return PublishedWorkload(
            hidden=w["hidden"],
            tokens_per_rank=w["tokens_per_rank"],
            topk=w["topk"],
            experts=w["experts"],
            dtype=w["dtype"],
            combine_dtype=w.get("combine_dtype", "bf16"),
            routing=spec,
        )
    except (KeyError, TypeError, MoelabError) as exc:
        raise MoelabError(f"{where}: bad workload {w}: {exc}") from exc


def parse_dataset(name: str, doc: dict[str, Any], where: str) -> list[PublishedRow]:
    ds = _keys(f"{where} [dataset]", doc.get("dataset"), DATASET_KEYS, DATASET_KEYS)
    tables = {
        t: _keys(f"{where} [tables.{t}]", body, TABLE_KEYS, TABLE_KEYS)
        for t, body in dict(doc.get("tables", {})).items()
    }
    rows = []
    for i, raw in enumerate(doc.get("rows", [])):
        row = _keys(f"{where} rows[{i}]", raw, ROW_KEYS, {"table", "ep", "op", "gbps", "definition"})
        t = tables.get(row["table"])
        if t is None:
            raise MoelabError(f"{where} rows[{i}]: no table {row['table']!r}")
        if row["op"] not in OPS or row["definition"] not in DEFINITION_ROWS or t["family"] not in FAMILIES:
            raise MoelabError(f"{where} rows[{i}]: op, definition or family unknown: {row}")
        rows.append(
            PublishedRow(
                dataset=name,
                library=ds["library"],
                version=ds["version"],
                repository=ds["repository"],
                hardware_text=ds["hardware_text"],
                gpu=ds["gpu"],
                nic=ds["nic"],
                gpus_per_node=ds["gpus_per_node"],
                nics_per_node=ds["nics_per_node"],
                table=row["table"],
                title=t["title"],
                document=t["document"],
                commit=t["commit"],
                date=t["date"],
                test=t["test"],
                family=t["family"],
                backends=tuple(t["backends"]),
                workload=_workload(f"{where} [tables.{row['table']}]", t["workload"]),
                ep=row["ep"],
                op=row["op"],
                gbps=float(row["gbps"]),
                definition=row["definition"],
                time_us=row.get("time_us"),
                reason=row.get("reason"),
            )
        )
    return rows


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckedRow:
    row: PublishedRow
    bound: Bound
    traffic_method: str

    @property
    def bound_gbps(self) -> float:
        return self.bound.gbps(self.row.definition)

    @property
    def ratio(self) -> float:
        return self.row.gbps / self.bound_gbps

    @property
    def implied_bytes(self) -> float | None:
        """A row that gives both a time and a bandwidth implies its bytes: against the model's, a check of
        the byte definition."""
        return None if self.row.time_us is None else self.row.gbps * self.row.time_us * 1e3

    @property
    def problem(self) -> str | None:
        if self.ratio > 1.0:
            return f"{self.row.row_id}: published {self.row.gbps:g} GB/s is above its bound {self.bound_gbps:.1f} GB/s"
        if self.ratio < LOW_RATIO and not self.row.reason:
            return f"{self.row.row_id}: published/bound {self.ratio:.2f} is under {LOW_RATIO} and the row gives no reason"
        return None

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "id": r.row_id,
            "library": r.library,
            "version": r.version,
            "table": r.title,
            "ep": r.ep,
            "op": r.op,
            "family": r.family,
            "definition": r.definition,
            "published_gbps": r.gbps,
            "published_time_us": r.time_us,
            "bound_gbps": self.bound_gbps,
            "bound_time_us": self.bound.time_us,
            "ratio": self.ratio,
            "bottleneck": self.bound.bottleneck,
            "implied_bytes": self.implied_bytes,
            "model_bytes": self.bound.definitions[r.definition],
            "reason": r.reason,
            "problem": self.problem,
            "hardware": {
                "gpu": r.gpu,
                "nic": r.nic,
                "gpus_per_node": r.gpus_per_node,
                "nodes": r.nodes,
                "stated": r.hardware_text,
            },
            "source": {
                "document": r.document,
                "commit": r.commit,
                "date": r.date,
                "repository": r.repository,
                "test": r.test,
            },
            "traffic": self.traffic_method,
            "bound": self.bound.to_dict(),
        }


@lru_cache(maxsize=32)
def _traffic(workload: Workload, world: int, gpus_per_node: int) -> Traffic:
    """A table's dispatch and combine rows share one count."""
    return traffic(workload, world, gpus_per_node)


def check_row(row: PublishedRow, table: PeakTable, latency: Latency | None = None) -> CheckedRow:
    """The row's bound on its own hardware (the named table's datasheet figures) and workload."""
    topology = resolve(
        TopologyRequest(
            nodes=row.nodes,
            gpus_per_node=min(row.ep, row.gpus_per_node),
            gpu=row.gpu,
            nic=row.nic,
            nics_per_node=row.nics_per_node if row.nodes > 1 else None,
        ),
        table,
    )
    wl = row.workload.workload(row.ep)
    tr = _traffic(wl, row.ep, topology.gpus_per_node)
    est = estimate(
        tr,
        topology,
        hidden=wl.hidden,
        dtype=wl.dtype,
        combine_dtype=row.workload.combine_dtype,
        families=(row.family,),
        latency=latency,
    )
    return CheckedRow(row=row, bound=est.get(row.family, row.op), traffic_method=tr.method)
