"""Published EP figures as data (moelab/model/published_tables/*.toml), each row with its source, hardware and
workload, and each row held against the bound of its own hardware.

A row's figure is a bandwidth in a named byte definition (moelab.core.definitions: `nvl_recv` is DeepEP's
"NVL", `rdma_pairs` its "RDMA", `ll_selections` its low-latency bytes); the bound in that definition is
the definition's bytes over the bound time, so published / bound is the bound time over the published
time whatever the definition. A row that gives only a time (a table whose bytes are counted in a way no
stored definition matches) is held by its time: published / bound is then the bound time over its time;
a `roundtrip` row is one dispatch and one combine timed together, its bound the sum of the two.

A row above 1.0 is a modelling error (a byte definition that differs, own traffic counted where it crosses
no link) and fails the check; a row under 0.5 must say why in `reason`, and so must a row under 0.7 whose
bottleneck is the NIC (there the bound is the port rate, which the best published kernels reach to within
70%); a table may give one `reason` that holds for all its rows. A row the model cannot express (a
workload its source does not state, a fabric it has no figure for) says why in `unexpressed` and is
listed, not checked.

A low row is not taken on trust as link-bound: where a row of the same table, ranks and link differing in
one setting (more SMs, kernel-only timing, more bytes per row, the dispatch of a combine) reaches a larger
share of the same bound, the link was shown to carry more, and the row is classified by that setting
(`Limiter`: SMs, time outside the kernel, per-row cost, the combine's own work) with that row named as the
evidence. Only rows with no such evidence stay link-bound.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
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
NIC_TIGHT = 0.7  # a row whose bottleneck is the NIC must reach this, or carry its reason
# a row of the same table must reach this much more of its bound to show the link carried more: published
# medians of one configuration differ by a few percent from run to run
SIBLING_MARGIN = 1.05
ROW_OPS = (*OPS, "roundtrip")  # a published row's op: one of the model's, or both in turn
ROUTING_FIELDS = ("routing", "seed", "group_ranks", "topk_groups", "zipf_s", "hot_experts", "hot_share")
TABLE_OPTIONAL = {"history", "unexpressed", "reason"}
TABLE_KEYS = {
    "unexpressed",
    "reason",
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
ROW_KEYS = {
    "table",
    "ep",
    "op",
    "gbps",
    "definition",
    "time_us",
    "reason",
    "sms",
    "timing",
    "dtype",
    "unexpressed",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedWorkload:
    hidden: int
    tokens_per_rank: int
    topk: int
    experts: int  # in all (0: `experts_per_rank` is fixed instead, the experts grow with EP)
    dtype: str
    combine_dtype: str
    routing: RoutingSpec
    experts_per_rank: int = 0  # a table that fixes the local experts (Hybrid-EP's "Local Experts: 8")

    def workload(self, world: int) -> Workload:
        if self.experts_per_rank:
            return self._at(world, self.experts_per_rank)
        if self.experts % world:
            raise MoelabError(f"{self.experts} experts do not divide over EP{world}")
        return self._at(world, self.experts // world)

    def experts_at(self, world: int) -> int:
        return self.experts_per_rank * world if self.experts_per_rank else self.experts

    def _at(self, world: int, experts_per_rank: int) -> Workload:
        return Workload(
            hidden=self.hidden,
            tokens_per_rank=self.tokens_per_rank,
            topk=self.topk,
            experts_per_rank=experts_per_rank,
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
    workload: PublishedWorkload | None  # None: its source states none (the row is unexpressed)
    ep: int
    op: str
    gbps: float | None  # None: the row gives only a time
    definition: str | None  # None with gbps
    time_us: float | None
    reason: str | None
    sms: int | None = None  # the SM count the row was measured at, where the table gives one
    timing: str | None = None  # how the table timed it where it gives several ("torch-api", "kernel")
    dtype: str | None = None  # the row's dispatch payload where the table has several (else the workload's)
    unexpressed: str | None = None  # why the model cannot hold this row (listed, not checked)

    @property
    def row_id(self) -> str:
        extra = "".join(
            f"/{x}" for x in (self.dtype, f"sm{self.sms}" if self.sms else None, self.timing) if x
        )
        return f"{self.dataset}/{self.table}/ep{self.ep}/{self.op}{extra}"

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
            experts=w.get("experts", 0),
            experts_per_rank=w.get("experts_per_rank", 0),
            dtype=w["dtype"],
            combine_dtype=w.get("combine_dtype", "bf16"),
            routing=spec,
        )
    except (KeyError, TypeError, MoelabError) as exc:
        raise MoelabError(f"{where}: bad workload {w}: {exc}") from exc


def _required(body: Any) -> set[str]:
    """A table the model cannot express may lack the workload its source does not state."""
    unexpressed = isinstance(body, dict) and "unexpressed" in body
    return TABLE_KEYS - TABLE_OPTIONAL - ({"workload"} if unexpressed else set())


def _row_workload(where: str, w: dict[str, Any] | None, dtype: str | None) -> PublishedWorkload | None:
    """The table's workload, with the row's own dispatch payload where the table has several."""
    if w is None:
        return None
    return _workload(where, w if dtype is None else {**w, "dtype": dtype})


def _figure(where: str, row: dict[str, Any]) -> None:
    """A row gives a bandwidth in a stored definition, or a time alone; a roundtrip only a time (no stored
    definition counts a dispatch and a combine together)."""
    if "gbps" in row:
        if row.get("definition") not in DEFINITION_ROWS or row["op"] == "roundtrip":
            raise MoelabError(
                f"{where}: a bandwidth needs a known definition and a dispatch or combine: {row}"
            )
    elif "definition" in row or not isinstance(row.get("time_us"), (int, float)):
        raise MoelabError(f"{where}: a row gives gbps with its definition, or time_us alone: {row}")


def parse_dataset(name: str, doc: dict[str, Any], where: str) -> list[PublishedRow]:
    ds = _keys(f"{where} [dataset]", doc.get("dataset"), DATASET_KEYS, DATASET_KEYS)
    tables = {
        t: _keys(f"{where} [tables.{t}]", body, TABLE_KEYS, _required(body))
        for t, body in dict(doc.get("tables", {})).items()
    }
    rows = []
    for i, raw in enumerate(doc.get("rows", [])):
        row = _keys(f"{where} rows[{i}]", raw, ROW_KEYS, {"table", "ep", "op"})
        t = tables.get(row["table"])
        if t is None:
            raise MoelabError(f"{where} rows[{i}]: no table {row['table']!r}")
        if row["op"] not in ROW_OPS or t["family"] not in FAMILIES:
            raise MoelabError(f"{where} rows[{i}]: op or family unknown: {row}")
        _figure(f"{where} rows[{i}]", row)
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
                workload=_row_workload(
                    f"{where} [tables.{row['table']}]", t.get("workload"), row.get("dtype")
                ),
                ep=row["ep"],
                op=row["op"],
                gbps=float(row["gbps"]) if "gbps" in row else None,
                definition=row.get("definition"),
                time_us=row.get("time_us"),
                reason=row.get("reason") or t.get("reason"),
                sms=row.get("sms"),
                timing=row.get("timing"),
                dtype=row.get("dtype"),
                unexpressed=row.get("unexpressed") or t.get("unexpressed"),
            )
        )
    return rows


@dataclass(frozen=True, kw_only=True, slots=True)
class Limiter:
    """What sets a row's time where its own table shows the link carrying more: the setting by which the
    evidence row differs, that row, and the share of its bound it reaches."""

    kind: str  # a key of LIMITERS
    evidence: str  # the row id that reaches more of the same link
    evidence_ratio: float
    evidence_time_us: float | None = None  # where the rows compare by time (another library's)

    @property
    def text(self) -> str:
        if self.evidence_time_us is not None:
            return f"{LIMITERS[self.kind]}: {self.evidence} takes {self.evidence_time_us:g} us"
        return f"{LIMITERS[self.kind]}: {self.evidence} reaches {self.evidence_ratio:.2f} of its bound"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "evidence": self.evidence,
            "evidence_ratio": self.evidence_ratio,
            "evidence_time_us": self.evidence_time_us,
            "why": self.text,
        }


LIMITERS = {
    "sms": "SM-limited: the same table at more SMs reaches more of the same link",
    "api-overhead": (
        "time outside the kernel (the torch API timing adds a device copy and flag updates): the kernel-only "
        "time of the same configuration reaches more of the same link"
    ),
    "per-token": (
        "per-token work: a row moving more bytes per token through the same ranks and link reaches more of "
        "it, so the bytes do not set this row's time"
    ),
    "per-message": (
        "per-message cost: messages of more bytes through the same ranks and link reach more of it (the "
        "low-latency kernels send one message per (token, expert)), so the bytes do not set this row's time"
    ),
    "combine-path": (
        "the combine's own work (its reduction and the reverse forwarding): the dispatch of the same "
        "configuration, with no more bytes per row, reaches more of the same link"
    ),
    "implementation": (
        "the library, not the hardware: another library on the same page, hardware and workload does the "
        "same op faster (a larger share of the same bound in the same byte definition, or, where the page "
        "gives times alone at one common boundary, less time)"
    ),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckedRow:
    row: PublishedRow
    bound: Bound  # a roundtrip's dispatch
    traffic_method: str
    limiter: Limiter | None = None  # set by check_tables from the row's own table
    then: Bound | None = None  # a roundtrip's combine

    @property
    def bound_time_us(self) -> float:
        return self.bound.time_us + (self.then.time_us if self.then else 0.0)

    @property
    def link_bottleneck(self) -> str:
        """The link that sets the bound's time (a roundtrip's: that of its longer op)."""
        longer = max((self.bound, self.then or self.bound), key=lambda b: b.time_us)
        return longer.bottleneck

    @property
    def bound_gbps(self) -> float | None:
        return None if self.row.definition is None else self.bound.gbps(self.row.definition)

    @property
    def ratio(self) -> float:
        if self.row.gbps is None or self.bound_gbps is None:
            assert self.row.time_us is not None  # parse_dataset: a row without gbps gives its time
            return self.bound_time_us / self.row.time_us
        return self.row.gbps / self.bound_gbps

    @property
    def implied_bytes(self) -> float | None:
        """A row that gives both a time and a bandwidth implies its bytes: against the model's, a check of
        the byte definition."""
        if self.row.time_us is None or self.row.gbps is None:
            return None
        return self.row.gbps * self.row.time_us * 1e3

    @property
    def nic_bound(self) -> bool:
        """The bound's time is the NIC's and the row's own table gives no evidence of another limit."""
        return self.link_bottleneck.startswith("nic") and self.limiter is None

    @property
    def bottleneck(self) -> str:
        """What sets the row's time: the limit its table shows, else the bound's slowest link."""
        return self.limiter.kind if self.limiter else self.link_bottleneck

    @property
    def figure(self) -> str:
        r = self.row
        if r.gbps is not None and self.bound_gbps is not None:
            return f"published {r.gbps:g} GB/s is above its bound {self.bound_gbps:.1f} GB/s"
        return f"published {r.time_us:g} us is under its bound {self.bound_time_us:.1f} us"

    @property
    def problem(self) -> str | None:
        if self.ratio > 1.0:
            return f"{self.row.row_id}: {self.figure}"
        if self.ratio < LOW_RATIO and not (self.row.reason or self.limiter):
            return f"{self.row.row_id}: published/bound {self.ratio:.2f} is under {LOW_RATIO} and the row gives no reason"
        if self.nic_bound and self.ratio < NIC_TIGHT and not self.row.reason:
            return f"{self.row.row_id}: NIC-bound, published/bound {self.ratio:.2f} is under {NIC_TIGHT} and the row gives no reason"
        return None

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "id": r.row_id,
            "dataset": r.dataset,
            "sms": r.sms,
            "timing": r.timing,
            "dtype": r.workload.dtype if r.workload else r.dtype,
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
            "bound_time_us": self.bound_time_us,
            "ratio": self.ratio,
            "bottleneck": self.bottleneck,
            "link_bottleneck": self.link_bottleneck,
            "limited_by": self.limiter.to_dict() if self.limiter else None,
            "nic_bound": self.nic_bound,
            "implied_bytes": self.implied_bytes,
            "model_bytes": self.bound.definitions[r.definition] if r.definition else None,
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
            "then": self.then.to_dict() if self.then else None,
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
            nic=row.nic or None,
            nics_per_node=row.nics_per_node if row.nodes > 1 else None,
        ),
        table,
    )
    if row.workload is None or row.unexpressed:
        raise MoelabError(f"{row.row_id} cannot be expressed: {row.unexpressed}")
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
    if row.op == "roundtrip":
        return CheckedRow(
            row=row,
            bound=est.get(row.family, "dispatch"),
            then=est.get(row.family, "combine"),
            traffic_method=tr.method,
        )
    return CheckedRow(row=row, bound=est.get(row.family, row.op), traffic_method=tr.method)


def _differs_by(row: CheckedRow, other: CheckedRow) -> str | None:
    """The one setting by which `other` differs from `row` that would explain `row` reaching less of the same
    link (a key of LIMITERS), or None when they differ otherwise."""
    a, b = row.row, other.row
    assert a.workload is not None and b.workload is not None
    same_payload = a.op == b.op and a.workload.dtype == b.workload.dtype
    if same_payload and a.timing == b.timing and a.sms is not None and b.sms is not None and b.sms > a.sms:
        return "sms"
    if same_payload and a.sms == b.sms and a.timing == "torch-api" and b.timing == "kernel":
        return "api-overhead"
    if a.sms != b.sms or a.timing != b.timing:
        return None
    if other.bound.bytes_per_row > row.bound.bytes_per_row:
        return "per-message" if a.family == "low_latency" else "per-token"
    if (
        a.op == "combine"
        and b.op == "dispatch"
        and a.workload.dtype == b.workload.dtype
        and other.bound.bytes_per_row <= row.bound.bytes_per_row
    ):
        return "combine-path"
    return None


def limiter(row: CheckedRow, table_rows: Sequence[CheckedRow]) -> Limiter | None:
    """The limit the row's own table shows: among the rows of the same table and ranks whose bound is set by
    the same link and which differ from it in one setting, the one reaching the most of its bound, if it
    reaches SIBLING_MARGIN times the row's share."""
    best: Limiter | None = None
    for other in table_rows:
        if (
            other.row.ep != row.row.ep
            or other.link_bottleneck != row.link_bottleneck
            or other.ratio < row.ratio * SIBLING_MARGIN
        ):
            continue
        kind = _differs_by(row, other)
        if kind and (best is None or other.ratio > best.evidence_ratio):
            best = Limiter(kind=kind, evidence=other.row.row_id, evidence_ratio=other.ratio)
    return best


def _same_case(a: CheckedRow, b: CheckedRow) -> bool:
    """The same op, ranks, workload, SMs and timing, its bound set by the same link."""
    x, y = a.row, b.row
    same = (x.ep, x.op, x.sms, x.timing, x.workload) == (y.ep, y.op, y.sms, y.timing, y.workload)
    return same and a.link_bottleneck == b.link_bottleneck


def implementation(row: CheckedRow, other_tables: Sequence[CheckedRow]) -> Limiter | None:
    """Where another library's table of the same dataset (one page: the same hardware and workload) does the
    row's case faster: by the share of the same bound in the same definition, or, where both rows give a
    time alone (a common-boundary comparison), by time; the fastest such row, if SIBLING_MARGIN faster."""
    best: tuple[float, Limiter] | None = None
    for other in other_tables:
        if not _same_case(row, other):
            continue
        a, b = row.row, other.row
        if a.gbps is None and b.gbps is None and a.time_us and b.time_us:
            gain, time_us = a.time_us / b.time_us, b.time_us
        elif a.gbps is not None and (a.family, a.definition) == (b.family, b.definition):
            gain, time_us = other.ratio / row.ratio, None
        else:
            continue
        if gain >= SIBLING_MARGIN and (best is None or gain > best[0]):
            found = Limiter(
                kind="implementation",
                evidence=b.row_id,
                evidence_ratio=other.ratio,
                evidence_time_us=time_us,
            )
            best = (gain, found)
    return best[1] if best else None


def classify(table_rows: Sequence[CheckedRow], other_tables: Sequence[CheckedRow] = ()) -> list[CheckedRow]:
    """Each row of one table with the limit its siblings show (moelab.model.published.limiter), else the
    one another library's table of the same page shows (implementation)."""
    return [
        dataclasses.replace(c, limiter=limiter(c, table_rows) or implementation(c, other_tables))
        for c in table_rows
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class TableCheck:
    """One published table held against the model: its rows that hold, their ratio range, and the rows the
    model cannot express, each with its reason."""

    dataset: str
    table: str
    title: str
    source: str
    checked: tuple[CheckedRow, ...]
    unexpressed: tuple[PublishedRow, ...]

    @property
    def held(self) -> tuple[CheckedRow, ...]:
        return tuple(c for c in self.checked if c.problem is None)

    @property
    def problems(self) -> list[str]:
        return [c.problem for c in self.checked if c.problem]

    def ratio_range(self) -> tuple[float, float] | None:
        ratios = [c.ratio for c in self.checked]
        return (min(ratios), max(ratios)) if ratios else None

    def to_dict(self) -> dict[str, Any]:
        span = self.ratio_range()
        nic = [c.ratio for c in self.checked if c.nic_bound]
        return {
            "dataset": self.dataset,
            "table": self.table,
            "title": self.title,
            "source": self.source,
            "rows": len(self.checked) + len(self.unexpressed),
            "held": len(self.held),
            "ratio_min": span[0] if span else None,
            "ratio_max": span[1] if span else None,
            "nic_bound_rows": len(nic),
            "nic_bound_ratio_min": min(nic) if nic else None,
            "limited_elsewhere": {
                k: sum(1 for c in self.checked if c.limiter and c.limiter.kind == k) for k in LIMITERS
            },
            "above_bound": [c.row.row_id for c in self.checked if c.ratio > 1.0],
            "problems": self.problems,
            "unexpressed": [{"id": r.row_id, "reason": r.unexpressed} for r in self.unexpressed],
        }


def check_tables(
    rows: list[PublishedRow], table: PeakTable, latency: Latency | None = None
) -> list[TableCheck]:
    """Every table's rows held against their bounds (those the model can express), table by table."""
    out: dict[tuple[str, str], tuple[list[CheckedRow], list[PublishedRow], PublishedRow]] = {}
    for r in rows:
        checked, unexpressed, _ = out.setdefault((r.dataset, r.table), ([], [], r))
        if r.unexpressed or r.workload is None:
            unexpressed.append(r)
        else:
            checked.append(check_row(r, table, latency))
    by_dataset: dict[str, list[CheckedRow]] = {}
    for (ds, _), (c, _, _) in out.items():
        by_dataset.setdefault(ds, []).extend(c)
    return [
        TableCheck(
            dataset=ds,
            table=t,
            title=f"{first.library}: {first.title}",
            source=f"{first.source}; {first.version}",
            checked=tuple(classify(c, [o for o in by_dataset[ds] if o.row.table != t])),
            unexpressed=tuple(u),
        )
        for (ds, t), (c, u, first) in out.items()
    ]
