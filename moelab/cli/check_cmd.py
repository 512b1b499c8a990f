"""`moelab check`: the CI regression gate (exit 0 pass, 1 regression, 2 usage error, 3 cannot judge: invalid
samples, an op whose noise hides a threshold-sized change, or a hardware/software difference, 4 contended:
a case found contended while it ran), and `--history`: where each case's median stepped over the store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from moelab.cli.common import DB_OPTION_HELP, console, print_table, user_errors
from moelab.cli.output_check import check_outputs
from moelab.core.display import safe_text
from moelab.core.errors import MoelabError
from moelab.gate import outputs
from moelab.gate.above import above_bound_flags
from moelab.gate.baseline import candidate_run, load_baseline
from moelab.gate.decision import GateResult, Policy, decide, matched
from moelab.gate.samples import env_differences, load_side
from moelab.store.db import open_db, resolve_db_path


def _write(path: Path, text: str, append: bool = False) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if append else "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise MoelabError(f"cannot write {path}: {exc}") from exc


def footnoted(rows: list[list[Any]], column: int) -> tuple[list[list[Any]], list[str]]:
    """Each distinct note once, under the table, and its number in the rows: six rows with the same cause
    read as one cause, not six."""
    notes: dict[str, int] = {}
    out = []
    for row in rows:
        note = str(row[column] or "")
        marked = list(row)
        if note:
            marked[column] = f"[{notes.setdefault(note, len(notes) + 1)}]"
        out.append(marked)
    return out, list(notes)


def _judge(
    path: Path, baseline: str, run: str | None, policy: Policy
) -> tuple[GateResult, str, str, list[str]]:
    """(the verdict, how the baseline was described, the candidate's run id, its above-bound flags)."""
    from moelab.reports.run_view import load_view

    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        base, described = load_baseline(con, baseline)
        cand_id = candidate_run(con, run, exclude=base.run_id if base.where == "database" else None)
        if cand_id == base.run_id and base.where == "database":
            raise MoelabError(f"the run to check and the baseline are the same run ({cand_id})")
        cand = load_side(con, cand_id, leave_out=(base.run_id,))
        flags = above_bound_flags(load_view(con, cand_id, judged_note=False).results)
    return decide(base, cand, policy, described, env_differences(base, cand)), described, cand_id, flags


def _history(path: Path) -> None:
    """`--history`: the steps of every case's median over the store, one row each."""
    from moelab.gate.changes import find_changes
    from moelab.store.noise_history import series

    if not path.exists():
        raise MoelabError(f"no database at {path}")
    with open_db(path, read_only=True) as con:
        found = find_changes(series(con))
    for line in found.notes:
        console.print(safe_text(line))
    if found.changes:
        print_table(
            ["case", "op", "hardware", "run", "after run", "before µs", "after µs", "change", "what changed"],
            [
                [f"{c.backend} {c.case_id}", c.op, c.hardware, c.run_id, c.previous_run, c.before_us,
                 c.after_us, f"{100 * c.change:+.1f}%", c.changed or "nothing recorded"]
                for c in found.changes
            ],
            title="steps in the store's history (ruptures' binary segmentation on log medians)",
        )  # fmt: skip
    console.print(
        safe_text(
            f"{len(found.changes)} steps in {found.series} series" if found.series else "no series to judge"
        )
    )


def _write_outputs(result: GateResult, summary: Path | None, junit: Path | None) -> None:
    """The Markdown summary (to --summary, else appended to GitHub's step summary when set) and JUnit XML."""
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary is not None:
        _write(summary, outputs.markdown(result))
    elif step_summary:
        _write(Path(step_summary), outputs.markdown(result), append=True)
    if junit is not None:
        _write(junit, outputs.junit(result))


@user_errors
def check(
    baseline: str | None = typer.Option(
        None,
        "--baseline",
        "-B",
        help="Baseline: a label, a run id, or an export folder (moelab db export); required unless --history",
    ),
    run: str | None = typer.Option(
        None, "--run", help="Run to check, a label or run id (default: the newest run)"
    ),
    threshold: float = typer.Option(
        5.0, "--threshold", help="Smallest slowdown of the median time that counts, in percent"
    ),
    fail_on_missing: bool = typer.Option(
        False, "--fail-on-missing", help="Also fail when a baseline case is missing from the run"
    ),
    allow_different_hardware: bool = typer.Option(
        False,
        "--allow-different-hardware",
        help="Compare even when the GPU model, driver, CUDA, NCCL or world size differ (named in the verdict)",
    ),
    summary: Path | None = typer.Option(
        None,
        "--summary",
        help="Write a Markdown summary here (default: append to $GITHUB_STEP_SUMMARY when set)",
    ),
    junit: Path | None = typer.Option(
        None, "--junit", help="Write JUnit XML here (one test per compared case and op)"
    ),
    show_all: bool = typer.Option(False, "--all", help="List unchanged ops too"),
    history: bool = typer.Option(
        False,
        "--history",
        help="Instead of a baseline: where each case's median stepped over the store's history, with the run "
        "and what changed there (commit, driver, CUDA, NCCL, torch, libraries)",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
) -> None:
    """Check a run against a baseline: fail on a slowdown past the threshold that is outside the noise.

    Exit 0 pass, 1 regression, 2 bad input, 3 cannot judge (samples NULL/NaN/zero/missing, an op whose
    noise hides a change of the threshold's size: "use --repeat N", or a hardware/software difference),
    4 contended (host load, other runs or health measured while a case ran). Each op's per-process
    medians are held to its noise, learned from earlier runs on the same hardware and software (else a
    prior per op class).

    Example: moelab check --baseline results/h200x2/export --junit check.xml  (or --baseline LABEL);
    moelab check --history
    """
    if not 0 < threshold < 1000:
        raise MoelabError(f"--threshold is a percentage between 0 and 1000, got {threshold}")
    check_outputs(resolve_db_path(db), {"--summary": summary, "--junit": junit}, {"--baseline": baseline})
    if history:
        if baseline is not None or run is not None:
            raise MoelabError("--history reads the whole store: give neither --baseline nor --run with it")
        _history(resolve_db_path(db))
        return
    if baseline is None:
        raise MoelabError("give --baseline (a label, a run id or an export folder), or --history")
    policy = Policy(
        threshold=threshold / 100,
        fail_on_missing=fail_on_missing,
        allow_different_hardware=allow_different_hardware,
    )
    result, described, cand_id, above = _judge(resolve_db_path(db), baseline, run, policy)
    if matched(result) == 0 and not result.failing and not result.refused:
        raise MoelabError(f"no case of run {cand_id} matches baseline {described}: nothing to check")
    console.print(safe_text(outputs.headline(result)))  # the verdict first
    console.print(safe_text(f"baseline: {described}; run: {cand_id}"))
    for line in outputs.rule_lines(result):
        console.print(safe_text(line))
    for line in above:
        console.print(safe_text(line))
    table, notes = footnoted(outputs.rows(result, include_unchanged=show_all), outputs.COLUMNS.index("note"))
    if table:
        print_table(outputs.COLUMNS, table)
    for n, note in enumerate(notes, 1):
        console.print(safe_text(f"[{n}] {note}"))
    _write_outputs(result, summary, junit)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
