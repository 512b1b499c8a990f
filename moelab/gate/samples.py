"""One run's cases as the gate sees them: the matching key, the status, and per-op iteration times
(each iteration's time is its slowest rank's, as everywhere in moelab)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import duckdb
import numpy as np

from moelab.store.order import case_order

CASE_KEY_FIELDS = (
    "backend",
    "hidden",
    "tokens_per_rank",
    "topk",
    "experts_per_rank",
    "routing",
    "seed",
    "dtype",
    "sms",
    "knobs",
    "world",
)

CaseKey = tuple[object, ...]


@dataclass(kw_only=True, slots=True)
class CaseSide:
    case_id: str
    status: str
    reason: str | None
    times: dict[str, np.ndarray] = field(default_factory=dict)  # op -> per-iteration times, µs


@dataclass(kw_only=True, slots=True)
class Side:
    run_id: str
    where: str  # "database" or the export folder it came from
    cases: dict[CaseKey, CaseSide]


def key_text(key: CaseKey) -> str:
    d = dict(zip(CASE_KEY_FIELDS, key, strict=True))
    knobs = json.loads(str(d["knobs"])) if d["knobs"] else {}
    extra = "".join(f" {k}={v}" for k, v in sorted(knobs.items()))
    sms = "default" if d["sms"] is None else d["sms"]
    return (
        f"{d['backend']} h{d['hidden']} t{d['tokens_per_rank']} k{d['topk']} e{d['experts_per_rank']} "
        f"{d['routing']} s{d['seed']} {d['dtype']} sm{sms} w{d['world']}{extra}"
    )


def load_side(con: duckdb.DuckDBPyConnection, run_id: str, where: str = "database") -> Side:
    rows = con.execute(
        f"""SELECT backend, hidden, tokens_per_rank, topk, experts_per_rank, routing, routing_seed, dtype, sms,
                  CAST(knobs AS VARCHAR), world, case_id, status, reason
           FROM cases WHERE run_id = ? ORDER BY {case_order()}""",
        [run_id],
    ).fetchall()
    cases: dict[CaseKey, CaseSide] = {}
    by_id: dict[tuple[str, str], CaseSide] = {}
    for r in rows:
        knobs = json.dumps(json.loads(r[9]) if r[9] else {}, sort_keys=True)
        key: CaseKey = (*r[:9], knobs, r[10])
        side = CaseSide(case_id=r[11], status=r[12], reason=r[13])
        cases.setdefault(key, side)
        by_id[(r[0], r[11])] = side
    per_iter = con.execute(
        """SELECT backend, case_id, op, list(t ORDER BY iter) FROM (
               SELECT backend, case_id, op, iter, max(time_us) AS t FROM samples WHERE run_id = ?
               GROUP BY backend, case_id, op, iter)
           GROUP BY backend, case_id, op""",
        [run_id],
    ).fetchall()
    grouped: dict[tuple[str, str], dict[str, np.ndarray]] = defaultdict(dict)
    for backend, case_id, op, times in per_iter:
        grouped[(backend, case_id)][op] = np.asarray(times, dtype=np.float64)
    for ident, ops in grouped.items():
        if ident in by_id:
            by_id[ident].times = ops
    return Side(run_id=run_id, where=where, cases=cases)
