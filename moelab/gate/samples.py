"""One run's cases as the gate sees them: the matching key, the status, the suspect mark, and per op the
iteration times (each iteration's time is its slowest rank's, as everywhere in moelab), the medians of each
start of the job (--repeat) and how many samples cannot be timings (NULL, NaN, infinite, zero or less);
and the run's hardware and software, which a baseline and a candidate must share to be compared."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import duckdb
import numpy as np

from moelab.store.db import has_column, has_table
from moelab.store.noise_history import HistoryKey, earlier_process_medians
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
ENV_FIELDS = {"gpu_name": "GPU", "driver": "driver", "cuda": "CUDA", "nccl": "NCCL"}

CaseKey = tuple[object, ...]


@dataclass(kw_only=True, slots=True)
class CaseSide:
    case_id: str
    status: str
    reason: str | None
    suspect_reason: str | None = (
        None  # measured contention or health: the case's numbers are not to be judged
    )
    judged: str | None = None  # what judging it against the store's history noticed (drift, spread): a note
    ops: list[str] = field(default_factory=list)  # ops with a stored result, in stored order
    times: dict[str, np.ndarray] = field(default_factory=dict)  # op -> per-iteration times, µs (valid ones)
    invalid: dict[str, tuple[int, int]] = field(default_factory=dict)  # op -> (bad samples, all samples)
    process_medians: dict[str, np.ndarray] = field(default_factory=dict)  # op -> median of each start


@dataclass(kw_only=True, slots=True)
class Side:
    run_id: str
    where: str  # "database" or the export folder it came from
    cases: dict[CaseKey, CaseSide]
    env: dict[str, set[str | None]] = field(default_factory=dict)  # ENV_FIELDS and "world" -> values
    repeats: int = 1  # starts of each job in the run
    # (backend, case, op) -> per-process medians of each earlier run on the same hardware and software
    history: dict[HistoryKey, list[list[float]]] = field(default_factory=dict)


def key_text(key: CaseKey) -> str:
    d = dict(zip(CASE_KEY_FIELDS, key, strict=True))
    knobs = json.loads(str(d["knobs"])) if d["knobs"] else {}
    extra = "".join(f" {k}={v}" for k, v in sorted(knobs.items()))
    sms = "default" if d["sms"] is None else d["sms"]
    return (
        f"{d['backend']} h{d['hidden']} t{d['tokens_per_rank']} k{d['topk']} e{d['experts_per_rank']} "
        f"{d['routing']} s{d['seed']} {d['dtype']} sm{sms} w{d['world']}{extra}"
    )


def _cases(
    con: duckdb.DuckDBPyConnection, run_id: str
) -> tuple[dict[CaseKey, CaseSide], dict[tuple[str, str], CaseSide]]:
    # contention is what was measured while the case ran (host load, other runs, health: the cases row
    # ingest wrote); what judging against history noticed afterwards (drift, spread) is only a note, or a
    # regression that drift noticed would be called contended
    suspect = (
        "CASE WHEN suspect THEN coalesce(nullif(suspect_reason, ''), 'suspect') END"
        if has_column(con, "cases", "suspect")
        else "NULL"
    )
    rows = con.execute(
        f"""SELECT backend, hidden, tokens_per_rank, topk, experts_per_rank, routing, routing_seed, dtype, sms,
                  CAST(knobs AS VARCHAR), world, case_id, status, reason, {suspect}
           FROM cases WHERE run_id = ? ORDER BY {case_order()}""",
        [run_id],
    ).fetchall()
    cases: dict[CaseKey, CaseSide] = {}
    by_id: dict[tuple[str, str], CaseSide] = {}
    for r in rows:
        knobs = json.dumps(json.loads(r[9]) if r[9] else {}, sort_keys=True)
        key: CaseKey = (*r[:9], knobs, r[10])
        side = CaseSide(case_id=r[11], status=r[12], reason=r[13], suspect_reason=r[14])
        cases.setdefault(key, side)
        by_id[(r[0], r[11])] = side
    if has_table(con, "judgments"):
        for backend, case_id, reasons in con.execute(
            # a rule's reason often begins with the rule's name already ("spread: ..."): said once
            """SELECT backend, case_id, string_agg(
                   CASE WHEN starts_with(reason, rule || ':') THEN reason ELSE rule || ': ' || reason END,
                   '; ' ORDER BY judged_at, seq)
               FROM judgments WHERE run_id = ? AND verdict = 'suspect' AND op IS NULL GROUP BY ALL""",
            [run_id],
        ).fetchall():
            if (backend, case_id) in by_id:
                by_id[(backend, case_id)].judged = reasons
    for backend, case_id, op in con.execute(
        "SELECT backend, case_id, op FROM results WHERE run_id = ? ORDER BY backend, case_id, op", [run_id]
    ).fetchall():
        if (backend, case_id) in by_id:
            by_id[(backend, case_id)].ops.append(op)
    return cases, by_id


BAD_SAMPLE = "time_us IS NULL OR NOT isfinite(time_us) OR time_us <= 0"


def _samples(
    con: duckdb.DuckDBPyConnection, run_id: str, by_id: dict[tuple[str, str], CaseSide], repeat: str
) -> None:
    """Per op: the valid iterations (an iteration any of whose ranks has a bad sample is left out), the count
    of bad samples, and each start's median."""
    per_iter = con.execute(
        f"""SELECT backend, case_id, op, list(t ORDER BY rep, iter) FILTER (WHERE NOT bad),
                   sum(n_bad)::BIGINT, sum(n)::BIGINT
            FROM (SELECT backend, case_id, op, {repeat} AS rep, iter, max(time_us) AS t,
                         count(*) FILTER (WHERE {BAD_SAMPLE}) AS n_bad, count(*) AS n,
                         bool_or({BAD_SAMPLE}) AS bad
                  FROM samples WHERE run_id = ? GROUP BY ALL)
            GROUP BY backend, case_id, op""",
        [run_id],
    ).fetchall()
    for backend, case_id, op, times, n_bad, n in per_iter:
        side = by_id.get((backend, case_id))
        if side is None:
            continue
        side.times[op] = np.asarray(times or [], dtype=np.float64)
        if n_bad:
            side.invalid[op] = (int(n_bad), int(n))
    medians = con.execute(
        f"""SELECT backend, case_id, op, list(m ORDER BY rep) FROM (
                SELECT backend, case_id, op, rep, median(t) AS m FROM (
                    SELECT backend, case_id, op, {repeat} AS rep, iter, max(time_us) AS t FROM samples
                    WHERE run_id = ? GROUP BY ALL HAVING NOT bool_or({BAD_SAMPLE}))
                GROUP BY ALL)
            GROUP BY backend, case_id, op""",
        [run_id],
    ).fetchall()
    for backend, case_id, op, meds in medians:
        side = by_id.get((backend, case_id))
        if side is not None and meds:
            side.process_medians[op] = np.asarray(meds, dtype=np.float64)


def _env(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, set[str | None]]:
    env: dict[str, set[str | None]] = defaultdict(set)
    cols = ", ".join(ENV_FIELDS)
    for row in con.execute(f"SELECT DISTINCT {cols} FROM environment WHERE run_id = ?", [run_id]).fetchall():
        for name, value in zip(ENV_FIELDS, row, strict=True):
            env[name].add(None if value is None else str(value))
    world = con.execute("SELECT world FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if world and world[0] is not None:
        env["world"].add(str(world[0]))
    return dict(env)


def load_side(
    con: duckdb.DuckDBPyConnection, run_id: str, where: str = "database", leave_out: tuple[str, ...] = ()
) -> Side:
    """One run's side; its `history` (the earlier runs the noise is learned from, `leave_out` not among
    them) is read for runs in the database."""
    cases, by_id = _cases(con, run_id)
    repeat = "repeat" if has_column(con, "samples", "repeat") else "0"
    _samples(con, run_id, by_id, repeat)
    found = con.execute(f"SELECT max({repeat}) FROM samples WHERE run_id = ?", [run_id]).fetchone()
    repeats = int(found[0]) + 1 if found and found[0] is not None else 1
    history = earlier_process_medians(con, run_id, leave_out) if where == "database" else {}
    return Side(
        run_id=run_id, where=where, cases=cases, env=_env(con, run_id), repeats=repeats, history=history
    )


def env_differences(base: Side, cand: Side) -> list[str]:
    """What differs between the two runs' GPU model, driver, CUDA, NCCL and world size, one line each (a
    side that recorded no environment is not held against the other)."""
    out = []
    for name, title in (*ENV_FIELDS.items(), ("world", "world size")):
        b, c = base.env.get(name), cand.env.get(name)
        if not b or not c or b == c:
            continue
        out.append(f"{title}: {_values(b)} (baseline) vs {_values(c)} (candidate)")
    return out


def _values(values: set[str | None]) -> str:
    return ", ".join(sorted("none" if v is None else v for v in values))
