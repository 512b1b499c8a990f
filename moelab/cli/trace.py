"""`moelab trace summarize`: the per-range, per-kernel table of one trace file."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from moelab.cli.common import console, print_table, user_errors
from moelab.core.errors import MoelabError
from moelab.tracing.nsys import export_sqlite, read_nsys_sqlite
from moelab.tracing.summary import TraceSummary
from moelab.tracing.torch_trace import summarize_chrome_trace

app = typer.Typer(
    help="Summarise profiler traces: API time, kernel-only time and kernel shares per range.\n\n"
    "Example: moelab trace summarize runs/RUN/nccl-a2a/traces/CASE/rank0.json\n\n"
    "moelab trace overlap TRACE: how much communication ran under the expert GEMMs (e2e layer traces).",
    no_args_is_help=True,
)


def load_summary(path: Path, prefix: str, nsys: str = "nsys") -> TraceSummary:
    """Chrome JSON (.json, .json.gz), nsys SQLite (.sqlite) or an .nsys-rep (exported first)."""
    if not path.exists():
        raise MoelabError(f"no trace at {path}")
    name = path.name
    if name.endswith(".nsys-rep"):
        return read_nsys_sqlite(export_sqlite(path, nsys=nsys), prefix=prefix)
    if name.endswith((".sqlite", ".db")):
        return read_nsys_sqlite(path, prefix=prefix)
    if name.endswith((".json", ".json.gz")):
        return summarize_chrome_trace(path, prefix=prefix)
    raise MoelabError(
        f"{path}: unknown trace type; give a Chrome trace (.json, .json.gz), an nsys .sqlite or .nsys-rep"
    )


@app.command("summarize")
@user_errors
def summarize(
    trace: Path = typer.Argument(
        ..., help="Chrome trace (.json/.json.gz), nsys export (.sqlite) or .nsys-rep"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON"),
    prefix: str = typer.Option(
        "moelab/", "--prefix", help="Only ranges whose name starts with this ('' for all)"
    ),
    nsys: str = typer.Option("nsys", "--nsys", help="nsys executable, to export an .nsys-rep"),
) -> None:
    """Print, per named range, its count, API and kernel-only time per instance, and its kernels' shares.

    Example: moelab trace summarize runs/RUN/nccl-a2a/traces/CASE/rank0.json
    """
    summary = load_summary(trace, prefix, nsys)
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2))
        return
    if not summary.ranges:
        console.print(f"no ranges starting with {prefix!r} in {trace}")
        return
    rank = "—" if summary.rank is None else str(summary.rank)
    console.print(f"{trace}  format={summary.format}  rank={rank}  attribution={summary.attribution}")
    print_table(
        ["range", "count", "api us/inst", "kernel us/inst", "events"],
        [
            (r.name, r.count, r.api_us_mean, r.kernel_us_mean, f"{len(r.kernels)} {r.event_kind}")
            for r in summary.ranges
        ],
    )
    rows = []
    for r in summary.ranges:
        for k in r.kernels:
            rows.append(
                (r.name, r.event_kind, k.name, k.count, k.total_us / r.count, f"{100 * k.share:.1f}%")
            )
    if rows:
        print_table(["range", "kind", "name", "count", "us/inst", "share"], rows)


@app.command("overlap")
@user_errors
def overlap(
    trace: Path = typer.Argument(..., help="Chrome trace (.json/.json.gz) of an e2e case (--trace torch)"),
    prefix: str = typer.Option("moelab/", "--prefix", help="Only ranges whose name starts with this"),
) -> None:
    """Per range (the overlapped and the serial layer of an e2e case): communication kernel time, GEMM
    kernel time, and how much of the communication ran while a GEMM ran.

    Example: moelab trace overlap runs/RUN/deepep/traces/CASE/rank0.json
    """
    from moelab.tracing.overlap import kernel_overlap

    if not trace.exists():
        raise MoelabError(f"no trace at {trace}")
    rows = kernel_overlap(trace, prefix)
    if not rows:
        console.print(f"no ranges starting with {prefix!r} in {trace}")
        return
    print_table(
        ["range", "count", "span us/inst", "comm us/inst", "gemm us/inst", "overlap us/inst", "comm hidden"],
        [
            (
                r.op,
                r.instances,
                r.span_us / r.instances,
                r.comm_us / r.instances,
                r.gemm_us / r.instances,
                r.overlap_us / r.instances,
                "—" if r.hidden_fraction is None else f"{100 * r.hidden_fraction:.0f}%",
            )
            for r in rows
        ],
        title=str(trace),
    )
