"""Reading the moelab side of a verification out of the store: the case of a (backend, payload), its stored
bandwidth under a definition, and per-rank times for figures the libraries define by time."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb


@dataclass(frozen=True, kw_only=True, slots=True)
class MoelabCase:
    case_id: str
    status: str
    reason: str | None


def case_for(con: duckdb.DuckDBPyConnection, run_id: str, backend: str, dtype: str) -> MoelabCase | None:
    row = con.execute(
        "SELECT case_id, status, reason FROM cases WHERE run_id = ? AND backend = ? AND dtype = ? ORDER BY case_id LIMIT 1",
        [run_id, backend, dtype],
    ).fetchone()
    return MoelabCase(case_id=row[0], status=row[1], reason=row[2]) if row else None


def bandwidth(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, op: str, definition: str
) -> float | None:
    row = con.execute(
        "SELECT gbps FROM bandwidths WHERE run_id = ? AND backend = ? AND case_id = ? AND op = ? AND definition = ?",
        [run_id, backend, case_id, op, definition],
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def rank0_mean_us(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, op: str
) -> float | None:
    """Rank 0's mean time after dropping its first sample: how DeepEP's tests' `bench` averages (with
    repeats, the median over the starts of each start's own)."""
    row = con.execute(
        """SELECT median(m) FROM (
               SELECT repeat, CASE WHEN count(*) > 1 THEN avg(time_us) FILTER (WHERE iter > 0) ELSE avg(time_us) END AS m
               FROM samples WHERE run_id = ? AND backend = ? AND case_id = ? AND op = ? AND rank = 0 GROUP BY repeat)""",
        [run_id, backend, case_id, op],
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def _result(
    con: duckdb.DuckDBPyConnection, column: str, run_id: str, backend: str, case_id: str, op: str
) -> float | None:
    """One stored figure of an op (`column` is one of this module's literals, never user input)."""
    row = con.execute(
        f"SELECT {column} FROM results WHERE run_id = ? AND backend = ? AND case_id = ? AND op = ?",
        [run_id, backend, case_id, op],
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def process_medians(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, op: str
) -> list[float]:
    """The op's median in each start of the job (--repeat), in start order; empty without repeats."""
    rows = con.execute(
        "SELECT median_us FROM process_results WHERE run_id = ? AND backend = ? AND case_id = ? AND op = ? "
        "AND median_us IS NOT NULL ORDER BY repeat",
        [run_id, backend, case_id, op],
    ).fetchall()
    return [float(r[0]) for r in rows]


def spread_note(ratio: float, merged_us: float, medians_us: list[float], tolerance: float) -> str | None:
    """With repeats, moelab's figure is over the median of the starts' medians: the range the ratio takes
    over the starts, and whether the verdict lies within it (the band 1 ± tolerance crossed by that range)."""
    if len(medians_us) < 2 or merged_us <= 0:
        return None
    ratios = [ratio * merged_us / m for m in medians_us]  # a start's figure scales as 1 / its time
    low, high = min(ratios), max(ratios)
    text = f"moelab over {len(ratios)} starts: ratio {low:.3f}-{high:.3f}"
    edge = any(low < b < high for b in (1 - tolerance, 1 + tolerance))
    return text + ("; the verdict is within moelab's spread between processes" if edge else "")


def kernel_us(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, op: str
) -> float | None:
    return _result(con, "kernel_us", run_id, backend, case_id, op)


def first_op(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, ops: tuple[str, ...]
) -> str | None:
    """The first of `ops` the case stored (op names that changed between versions: roundtrip, pair)."""
    stored = {
        r[0]
        for r in con.execute(
            "SELECT op FROM results WHERE run_id = ? AND backend = ? AND case_id = ?",
            [run_id, backend, case_id],
        ).fetchall()
    }
    return next((op for op in ops if op in stored), None)


def median_us(
    con: duckdb.DuckDBPyConnection, run_id: str, backend: str, case_id: str, op: str
) -> float | None:
    """moelab's own median of the op (each iteration after an L2 flush and a barrier, work queued ahead)."""
    return _result(con, "median_us", run_id, backend, case_id, op)


HOST_GAP = 0.9  # moelab's median below this share of its back-to-back time: its per-call host work shows


def back_to_back_note(median: float, back_to_back: float, library: float) -> str | None:
    """Why moelab's figure, timed the library's way (back-to-back calls), may fall short of the library's
    at a small size: moelab's call carries host work beyond the library's test loop (its Python wrapper, the
    NVTX range, for some backends its result contract's launches), which a GPU part this short does not
    hide when calls follow each other. Its own median, with work queued ahead, shows the GPU part."""
    if median > HOST_GAP * back_to_back:
        return None
    return (
        f"host-bound in moelab's call: {median:.1f} us per call with work queued ahead (its median) but "
        f"{back_to_back:.1f} us back to back (the library's way), against the library's {library:.1f} us; "
        "a GPU part this short does not hide the host work of moelab's call (wrapper, NVTX, contract)"
    )
