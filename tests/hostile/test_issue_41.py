"""Issue 41 lists its hostile inputs as bullets; each is one or more rows of the hostile table, where the
table's five checks run on it (tests/hostile/test_hostile.py). This walks the issue's list: a bullet without
a row, or a row named here that the table lacks, fails."""

from __future__ import annotations

import tests.hostile.checked_rows
import tests.hostile.concurrent_and_old
import tests.hostile.second_pass  # noqa: F401  (the modules that add their rows to CASES)
from tests.hostile.cases import CASES

# one entry per bullet of issue 41 (in its order), and the rows that show it
ISSUE_41: dict[str, tuple[str, ...]] = {
    # data lost or escaping its folder
    "export-into-a-folder-of-someone-elses-files": (
        "export-over-a-foreign-manifest-and-index",
        "export-over-an-export-holding-another-file",
        "export-force-replaces-a-foreign-folder",
    ),
    "plugin-entry-point-name-used-as-a-path": ("plugin-name-is-a-path",),
    "name-holding-esc-osc-printed-raw": (
        "plugin-name-holds-esc-and-osc-run",
        "plugin-name-holds-esc-and-osc-listing",
    ),
    "export-drops-the-labels": ("export-carries-the-labels",),
    "look-alike-labels-accepted-as-different": (
        "label-nfd-finds-the-nfc-label",
        "label-zero-width-space-look-alike",
        "label-bidi-override",
    ),
    "label-list-migrates-v1-v3-v7": (
        "label-list-never-migrates-v1",
        "label-list-never-migrates-v3",
        "label-list-never-migrates-v7",
    ),
    # unbounded input
    "repeat-100-million-memory-error": (
        "run-repeat-100-million-dry-run",
        "run-repeat-100-million-real",
        "suite-repeat-int64",
        "ingest-spec-repeats-int64",
    ),
    "repeat-int64-list-cases-accepted": ("run-repeat-int64-list-cases",),
    "repeat-interrupted-stores-nothing": (
        "run-repeat-1000-stopped-by-SIGINT",
        "ingest-interrupted-repeat-keeps-the-finished-starts",
    ),
    "query-fetches-every-row-and-ignores-ctrl-c": (
        "query-30-million-rows-capped",
        "query-never-ends-stopped-by-ctrl-c",
    ),
    "model-zipf-512-nodes-never-ends": ("model-zipf-512-nodes", "model-world-a-million"),
    "list-cases-over-100k-cases-slow": ("list-cases-over-100k-cases",),
    "garbage-nsys-report-and-sqlite-registered": (
        "ingest-garbage-nsys-report-not-registered",
        "ingest-garbage-sqlite-export-not-registered",
    ),
    # values accepted that mean nothing
    "model-nodes-0-and-experts-per-rank-0": ("model-nodes-0", "model-experts-per-rank-0"),
    "model-inf-and-nan-figures": ("model-nvlink-gbps-inf", "model-latency-nan", "model-latency-inf-json"),
    "model-json-emits-infinity": ("model-json-strict-where-a-link-has-no-bound", "model-latency-inf-json"),
    "model-from-run-json-note-before-the-json": ("model-from-run-json-prints-only-json",),
    "peaks-file-gbps-inf": ("model-peaks-gbps-inf",),
    "suite-checked-only-where-no-flag-replaces-it": (
        "suite-workload-experts-per-rank-1.5-replaced-by-a-flag",
        "suite-axis-hidden-string-replaced-by-a-flag",
        "suite-backend-workload-topk-0-replaced-by-a-flag",
    ),
    "ragged-samples-stored-as-ok": ("ingest-ragged-samples-stored-and-flagged",),
    "compare-ranks-all-zero-samples": ("compare-all-zero-samples-not-ranked",),
    "check-published-over-no-tables-passes": ("model-check-published-over-no-tables",),
    "export-manifest-lists-a-run-no-file-holds": ("gate-export-manifest-lists-a-run-no-file-holds",),
    # processes and blame
    "fake-nsys-version-hangs-child-left": ("nsys-version-hangs-children-reaped",),
    "plugin-availability-hangs": ("plugin-availability-hangs-run", "plugin-import-hangs-listing"),
    "plugin-sys-exit-or-keyboard-interrupt-at-import": (
        "plugin-import-sys-exit-3-listing",
        "plugin-import-sys-exit-3-run",
        "plugin-import-keyboard-interrupt-listing",
        "plugin-import-keyboard-interrupt-run",
    ),
    "failure-headline-blames-the-wrong-rank": (
        "blame-names-the-rank-stop",
        "blame-names-the-rank-exit0",
        "blame-names-the-rank-killed",
    ),
    "sighup-ends-the-run-at-once": ("run-stopped-by-SIGHUP",),
    "traceback-excerpt-80005-character-line": ("rank-traceback-80005-character-line-cut",),
    "run-directory-moved-mid-run": ("run-directory-moved-mid-run",),
    "report-and-suite-out-read-only-found-late": (
        "run-report-path-unwritable",
        "tune-suite-out-unwritable",
        "run-report-is-a-folder",
    ),
    "ulimit-n-12-hangs-the-job": ("run-under-ulimit-n-12",),
    # the second pass's new inputs the issue names besides its bullets: concurrent commands, old stores
    "concurrent-commands": (
        "two-runs-into-one-store-at-once",
        "ingest-one-run-directory-twice-at-once",
        "report-while-a-run-writes",
        "compare-while-a-run-writes",
        "db-export-while-a-run-writes",
    ),
    "old-stores": tuple(
        f"{what}-v{v}"
        for v in (1, 3, 7)
        for what in (
            "old-store-runs-refused",
            "old-store-report-refused",
            "old-store-compare-refused",
            "old-store-query-refused",
            "old-store-export-refused",
            "old-store-check-refused",
            "old-store-label-migrates-once",
            "old-store-ingest-migrates-once",
        )
    ),
}


def test_every_case_of_the_issue_is_a_row_of_the_table() -> None:
    rows = {c.id for c in CASES}
    without = [bullet for bullet, ids in ISSUE_41.items() if not ids]
    missing = {bullet: [i for i in ids if i not in rows] for bullet, ids in ISSUE_41.items()}
    assert not without, without
    assert not {b: m for b, m in missing.items() if m}, missing


def test_the_list_has_one_entry_per_bullet_of_the_issue() -> None:
    # 6 + 7 + 10 + 9 under the issue's four headings (the labels bullet's export and look-alikes apart, the
    # model bullet's four sub-bullets apart), and the two kinds of new input its opening names
    assert len(ISSUE_41) == 34
