"""The bulk samples insert stores exactly what the row-by-row one did, in the same order."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.store.db import migrate
from moelab.store.samples_bulk import SampleColumns, insert_samples


def _row_by_row(con: duckdb.DuckDBPyConnection, run_id: str, blocks: list[tuple[Any, ...]]) -> None:
    """The insert ingest used before: one Python row per sample."""
    rows = [
        (run_id, backend, case_id, op, rank, i, float(t), repeat)
        for backend, case_id, op, samples, repeat in blocks
        for rank, per_rank in enumerate(samples)
        for i, t in enumerate(per_rank)
    ]
    if rows:
        con.executemany(
            "INSERT INTO samples (run_id, backend, case_id, op, rank, iter, time_us, repeat) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )


block = st.tuples(
    st.sampled_from(["nccl-a2a", "deepep", "o'quote"]),
    st.text(min_size=1, max_size=12),
    st.sampled_from(["dispatch", "combine", "pair"]),
    st.lists(st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=0, max_size=30), min_size=1, max_size=4),
    st.integers(0, 4),  # the start of the job (--repeat)
)


@settings(max_examples=50, deadline=None)
@given(blocks=st.lists(block, min_size=0, max_size=6))
@pytest.mark.slow
def test_bulk_insert_equals_row_by_row(blocks: list[tuple[Any, ...]]) -> None:
    con = duckdb.connect(":memory:")
    migrate(con)
    cols = SampleColumns()
    for backend, case_id, op, samples, repeat in blocks:
        cols.add(backend, case_id, op, samples, repeat=repeat)
    assert insert_samples(con, "bulk", cols) == sum(len(r) for b in blocks for r in b[3])
    _row_by_row(con, "rows", blocks)
    query = "SELECT backend, case_id, op, rank, iter, time_us, repeat FROM samples WHERE run_id = ?"
    assert con.execute(query, ["bulk"]).fetchall() == con.execute(query, ["rows"]).fetchall()
    con.close()


def test_a_million_samples_in_one_statement() -> None:
    con = duckdb.connect(":memory:")
    migrate(con)
    cols = SampleColumns()
    rng = np.random.default_rng(0)
    for c in range(100):
        cols.add("nccl-a2a", f"case{c}", "dispatch", rng.lognormal(3, 0.1, (8, 1250)))
    assert insert_samples(con, "r", cols) == 1_000_000
    row = con.execute(
        "SELECT count(*), count(DISTINCT case_id), max(rank), max(iter) FROM samples WHERE run_id = 'r'"
    ).fetchone()
    assert row == (1_000_000, 100, 7, 1249)
    con.close()
