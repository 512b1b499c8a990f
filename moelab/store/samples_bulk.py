"""The raw samples of one run, gathered as NumPy blocks and inserted in one statement.

A run can hold millions of samples (every rank's time of every iteration of every op). Built as Python
lists and sent as `UNNEST(?::DOUBLE[])` parameters, 1M samples took seconds; here each (backend, case,
op) block stays one NumPy array, the per-sample columns are made by NumPy (repeat, tile, ravel), and
DuckDB scans the arrays in place (a replacement scan of a local variable). The strings of a sample are one small integer into the run's
distinct (backend, case, op) keys, looked up by list index in the INSERT: rows keep their order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np


@dataclass(kw_only=True, slots=True)
class SampleColumns:
    """Samples of one run, block by block: a block is one (backend, case, op, start) as [rank][iteration] µs."""

    keys: list[tuple[str, str, str]] = field(default_factory=list)  # (backend, case_id, op) of each block
    key: list[np.ndarray] = field(default_factory=list)  # per block: index into keys, one per sample
    rank: list[np.ndarray] = field(default_factory=list)
    iter: list[np.ndarray] = field(default_factory=list)
    time_us: list[np.ndarray] = field(default_factory=list)
    repeat: list[int] = field(default_factory=list)  # per block: the start of the job that measured it

    def add(
        self, backend: str, case_id: str, op: str, samples_us: Sequence[Sequence[float]], repeat: int = 0
    ) -> None:
        """One op's samples, [rank][iteration]; ranks may hold different counts."""
        index = len(self.keys)
        self.keys.append((backend, case_id, op))
        self.repeat.append(repeat)
        try:
            grid = np.asarray(samples_us, dtype=np.float64)
            regular = grid.ndim == 2
        except ValueError:  # ragged: ranks recorded different iteration counts
            regular = False
        if regular:
            ranks, iters = grid.shape
            self.rank.append(np.repeat(np.arange(ranks, dtype=np.int32), iters))
            self.iter.append(np.tile(np.arange(iters, dtype=np.int32), ranks))
            self.time_us.append(grid.reshape(-1))
        else:
            per_rank = [np.asarray(r, dtype=np.float64).reshape(-1) for r in samples_us]
            self.rank.append(
                np.concatenate([np.full(r.size, i, dtype=np.int32) for i, r in enumerate(per_rank)])
            )
            self.iter.append(np.concatenate([np.arange(r.size, dtype=np.int32) for r in per_rank]))
            self.time_us.append(np.concatenate(per_rank) if per_rank else np.zeros(0))
        self.key.append(np.full(self.time_us[-1].size, index, dtype=np.int32))

    def __len__(self) -> int:
        return sum(t.size for t in self.time_us)


def insert_samples(con: duckdb.DuckDBPyConnection, run_id: str, columns: SampleColumns) -> int:
    """Append the run's samples to `samples` (inside the caller's transaction); returns the row count."""
    count = len(columns)
    if count == 0:
        return 0
    _moelab_samples_scan = {  # noqa: F841 (read by DuckDB's replacement scan: the SQL names this variable)
        "key": np.concatenate(columns.key),
        "rank": np.concatenate(columns.rank),
        "iter": np.concatenate(columns.iter),
        "time_us": np.concatenate(columns.time_us),
    }
    backends, case_ids, ops = (list(c) for c in zip(*columns.keys, strict=True))
    repeats = list(columns.repeat)
    # a replacement scan, not con.register(): DuckDB 2 refuses register() while an earlier statement's
    # result is unread, which ingest's executemany inserts leave behind
    con.execute(
        "INSERT INTO samples (run_id, backend, case_id, op, rank, iter, time_us, repeat) "
        "SELECT ?, (?::VARCHAR[])[key + 1], (?::VARCHAR[])[key + 1], (?::VARCHAR[])[key + 1], rank, iter, time_us, "
        "(?::INTEGER[])[key + 1] FROM _moelab_samples_scan",
        [run_id, backends, case_ids, ops, repeats],
    )
    return count
