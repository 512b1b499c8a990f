"""Which runs a comparison reads, chosen in SQL so that `moelab compare` costs what it shows.

A comparison shows one cell per (group, case, op, SMs): the newest run's. Over thousands of runs most
rows are older measurements no cell shows, so the selected runs are narrowed, before anything is read
into Python, to those holding the newest row of some (group, backend, knobs, workload, op, SMs): a
finer partition than the table's, so every cell's newest row is kept. When the groups themselves are
runs (`--by run`, and `--by label`, a label per run), the groups are paged: the reference group and one
page of the others, `--groups` at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

# the fingerprint column of the lowest rank of (run, backend) that names a group, as compare.group_value
ENV_GROUP_COLUMN = {"gpu": "gpu_name", "nccl": "nccl", "driver": "driver", "torch": "torch"}
PAGED_KEYS = ("run", "label")


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    groups: list[str]  # the groups shown, reference first
    total: int  # how many groups the selected runs hold
    page: int  # 1-based
    pages: int

    @property
    def note(self) -> str | None:
        if self.pages <= 1:
            return None
        return (
            f"page {self.page} of {self.pages}: {len(self.groups)} of {self.total} groups shown (the reference "
            f"on every page); --page N for others, --groups K for more per page"
        )


def label_groups(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """run id -> its group for --by label: its labels (own label first), else the run id."""
    rows = con.execute(
        """SELECT r.run_id, r.label, (SELECT list(l.label ORDER BY l.label) FROM labels l WHERE l.run_id = r.run_id)
           FROM runs r SEMI JOIN _sel USING (run_id)"""
    ).fetchall()
    out = {}
    for run_id, own, names in rows:
        names = list(names or [])
        if own and own not in names:
            names.insert(0, own)
        out[str(run_id)] = ", ".join(names) or str(run_id)
    return out


def page_groups(
    con: duckdb.DuckDBPyConnection, by: str, reference: str | None, per_page: int, page: int
) -> Page | None:
    """For run-like groupings: narrow `_sel` to the runs of the reference group and of one page of the
    other groups (sorted as the table sorts them). None for other groupings (nothing to page)."""
    if by not in PAGED_KEYS:
        return None
    if by == "run":
        group_of = {str(r[0]): str(r[0]) for r in con.execute("SELECT run_id FROM _sel").fetchall()}
    else:
        group_of = label_groups(con)
    groups = sorted(set(group_of.values()))
    if not groups:
        return Page(groups=[], total=0, page=1, pages=1)
    ref = reference if reference in groups else groups[0]
    others = [g for g in groups if g != ref]
    size = max(1, per_page - 1)
    pages = max(1, -(-len(others) // size))
    page = min(max(1, page), pages)
    shown = [ref, *others[(page - 1) * size : page * size]]
    keep = set(shown)
    runs = [r for r, g in group_of.items() if g in keep]
    _replace_selection(con, runs)
    return Page(groups=shown, total=len(groups), page=page, pages=pages)


def newest_runs_only(con: duckdb.DuckDBPyConnection, by: str, label_of: dict[str, str] | None = None) -> int:
    """Narrow `_sel` to the runs holding the newest measurement of some (group, case, op, SMs) cell;
    returns how many runs remain."""
    if by in ENV_GROUP_COLUMN:
        col = ENV_GROUP_COLUMN[by]
        group_sql = f"""(SELECT arg_min(e.{col}, coalesce(e.rank, 2147483647)) FROM environment e
                          WHERE e.run_id = c.run_id AND e.backend = c.backend)"""
    elif by == "label" and label_of is not None:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _grp AS SELECT UNNEST(?::VARCHAR[]) AS run_id, UNNEST(?::VARCHAR[]) AS grp",
            [list(label_of), list(label_of.values())],
        )
        group_sql = "(SELECT g.grp FROM _grp g WHERE g.run_id = c.run_id)"
    elif by == "run":
        group_sql = "c.run_id"
    else:  # backend: backend and knobs are in the partition already
        group_sql = "NULL"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _sel AS
            SELECT DISTINCT run_id FROM (
                SELECT c.run_id, row_number() OVER (
                    PARTITION BY {group_sql}, c.backend, CAST(c.knobs AS VARCHAR), c.hidden, c.tokens_per_rank,
                                 c.topk, c.experts_per_rank, c.routing, c.routing_seed, c.dtype, c.world, r.op, c.sms
                    ORDER BY ru.created_at DESC, c.run_id DESC) AS newest
                FROM cases c JOIN results r USING (run_id, backend, case_id) JOIN runs ru USING (run_id)
                WHERE c.run_id IN (SELECT run_id FROM _sel))
            WHERE newest = 1"""
    )
    row = con.execute("SELECT count(*) FROM _sel").fetchone()
    return int(row[0]) if row else 0


def _replace_selection(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    con.execute("CREATE OR REPLACE TEMP TABLE _sel AS SELECT UNNEST(?::VARCHAR[]) AS run_id", [run_ids])
