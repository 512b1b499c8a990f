"""library_figures: the migration, storing and reading rows, and ingest restoring them from the run directory."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moelab.core.library_figures import VERDICTS, VerifyRow
from moelab.job.rundir import RunDir
from moelab.store.db import connect
from moelab.store.ingest import ingest
from moelab.store.schema import LATEST_VERSION, MIGRATIONS
from moelab.verify import store
from tests.synthetic_runs import RunModel, build_db


def _row(run_id: str, **kw: object) -> VerifyRow:
    base: dict[str, object] = dict(run_id=run_id, backend="deepep", library_test="tests/test_intranode.py", op="dispatch",
                                   dtype="bf16", figure="deepep_nvl", case_id="c1", library_label="dispatch BF16, SMs 24, NVL chunk default",
                                   library_gbps=332.16, moelab_gbps=327.6, ratio=327.6 / 332.16, tolerance=0.05, verdict="pass",
                                   source_log="verify/deepep_test_intranode.log", note=None)  # fmt: skip
    return VerifyRow(**(base | kw))  # type: ignore[arg-type]


def test_migration_adds_the_table(tmp_path: Path) -> None:
    con = connect(tmp_path / "m.duckdb")
    try:
        assert any(m.version == 4 and "library figures" in m.description for m in MIGRATIONS)
        cols = [
            r[0]
            for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'library_figures' ORDER BY ordinal_position"
            ).fetchall()
        ]
        assert tuple(cols) == store.COLUMNS
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == LATEST_VERSION  # type: ignore[index]
    finally:
        con.close()


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    library=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e4)),
    moelab=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e4)),
    verdict=st.sampled_from(VERDICTS),
    note=st.one_of(st.none(), st.text(max_size=200)),
)
def test_store_round_trip(
    tmp_path: Path, library: float | None, moelab: float | None, verdict: str, note: str | None
) -> None:
    con = connect(tmp_path / "rt.duckdb")
    try:
        rows = [
            _row("r1", library_gbps=library, moelab_gbps=moelab, verdict=verdict, note=note),
            _row("r1", op="combine"),
        ]
        store.store(con, "r1", rows, {"my_figure": "a figure verify derives"})
        store.store(con, "r1", rows, {})  # replaces, not doubles
        assert sorted(store.load(con, "r1"), key=lambda r: r.op) == sorted(rows, key=lambda r: r.op)
        assert con.execute("SELECT text FROM definitions WHERE name = 'my_figure'").fetchone() == (
            "a figure verify derives",
        )
    finally:
        con.close()


def test_ingest_restores_rows_from_the_run_directory(tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    (run_id,) = build_db(db, tmp_path / "runs", [RunModel(run_id="run-v")])
    run_dir = tmp_path / "runs" / run_id
    rows = [_row(run_id), _row(run_id, op="combine", verdict="fail", ratio=0.7)]
    assert RunDir(run_dir).write_library_figures(rows) == run_dir / "verify" / "library_figures.json"
    con = connect(db)
    try:
        assert store.load(con, run_id) == []
        ingest(con, run_dir)  # a re-ingest of the run directory brings the verify rows with it
        assert sorted(store.load(con, run_id), key=lambda r: r.op) == sorted(rows, key=lambda r: r.op)
        assert RunDir(tmp_path).library_figures() == []
    finally:
        con.close()


def test_report_section_lists_findings_first(tmp_path: Path) -> None:
    from moelab.reports.html import write_report

    db = tmp_path / "m.duckdb"
    (run_id,) = build_db(db, tmp_path / "runs", [RunModel(run_id="run-r")])
    con = connect(db)
    try:
        store.store(con, run_id, [_row(run_id), _row(run_id, op="combine", verdict="fail", ratio=0.7, moelab_gbps=232.5,
                                                     note="<script>x</script>\nsecond line")], {})  # fmt: skip
    finally:
        con.close()
    md = write_report(db, [run_id], tmp_path / "r.md", fmt="md").read_text()
    section = md[md.index("Verification against the libraries' own tests") :]
    assert section.index("| fail |") < section.index("| pass |") and "second line" not in section
    html = write_report(db, [run_id], tmp_path / "r.html").read_text()
    assert 'id="verification"' in html and "<b>fail</b>" in html and "232.5" in html
    assert "<script>x</script>" not in html and "&lt;script&gt;" in html
    (other,) = build_db(db, tmp_path / "runs2", [RunModel(run_id="run-plain")])
    assert 'id="verification"' not in write_report(db, [other], tmp_path / "p.html").read_text()
