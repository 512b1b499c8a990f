"""`moelab doctor`: is this node (or are these nodes) fit to benchmark on? A table per node, pass/warn/fail and why.

Exit code 0 when nothing fails, 1 when something does (or warns, with --strict), 2 on a usage error.
Many nodes: run `moelab doctor --save NODE.json` on each (the launchers will fan this out), then
`moelab doctor --from a.json --from b.json` anywhere to compare them and name the outliers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import typer

from moelab.cli.common import console, print_table, user_errors
from moelab.cli.output_check import check_outputs
from moelab.core.errors import MoelabError
from moelab.health.model import STATUS_RANK, HealthSnapshot, worst_status
from moelab.health.snapshot import load_snapshots, merge, take_snapshot
from moelab.store.db import resolve_db_path

SnapshotFn = Callable[..., HealthSnapshot]


def _read_snapshots(paths: list[Path]) -> list[HealthSnapshot]:
    """Every snapshot of the files, each once: one snapshot read twice (a file given twice, or a report
    holding a node's saved file) was judged as two nodes, and a node compared with itself hides an outlier."""
    snaps: list[HealthSnapshot] = []
    seen: dict[tuple[str, str, int | None], Path] = {}
    for path in paths:
        try:
            found = load_snapshots(json.loads(path.read_text()))
        except OSError as exc:
            raise MoelabError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise MoelabError(f"{path} is not a health snapshot or doctor report: {exc}") from None
        for snap in found:
            key = (snap.host, snap.taken_at, snap.local_gpu)
            if key in seen:
                raise MoelabError(
                    f"the snapshot of {snap.host} taken at {snap.taken_at} is in {seen[key]} and again in "
                    f"{path}: give each node's snapshot once"
                )
            seen[key] = path
        snaps += found
    return snaps


def _print_report(report: dict) -> None:
    findings = report["findings"]
    hosts = [n["host"] for n in report["nodes"]]
    for host in hosts:
        rows = [(f["status"], f["subject"], f["check"], f["reason"]) for f in findings if f["host"] == host]
        print_table(
            ["status", "subject", "check", "why"], rows, title=f"{host}: {worst_status(r[0] for r in rows)}"
        )
    cluster = report["cluster"]
    if cluster:
        cluster_rows = [(f["status"], f["host"], f["subject"], f["check"], f["reason"]) for f in cluster]
        print_table(
            ["status", "host", "subject", "check", "why"],
            cluster_rows,
            title=f"across GPUs and nodes: {worst_status(r[0] for r in cluster_rows)}",
        )
    every = findings + cluster
    counts = {s: sum(1 for f in every if f["status"] == s) for s in ("fail", "warn")}
    console.print(
        f"worst: {report['worst']} ({counts['fail']} fail, {counts['warn']} warn) over {len(hosts)} node(s)"
    )


# the longest matmul load per GPU: clocks settle within a second; a typo (a day of load) is refused at once
MAX_LOAD_MS = 60_000


def build_doctor(take: SnapshotFn = take_snapshot) -> Callable[..., None]:
    """The `doctor` command, probing through `take` (tests pass a snapshot function over fake devices)."""

    @user_errors
    def doctor(
        json_out: bool = typer.Option(False, "--json", help="Print the snapshots and findings as JSON"),
        load_ms: float = typer.Option(
            300.0,
            "--load-ms",
            help="Milliseconds of matmul load per GPU to read clocks under load (0: idle only)",
        ),
        from_files: list[Path] | None = typer.Option(
            None,
            "--from",
            help="Judge saved snapshots or doctor --json reports (repeat for each node) instead of probing this host",
        ),
        save: Path | None = typer.Option(
            None, "--save", help="Also write this host's snapshot to this JSON file"
        ),
        strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too"),
        sysfs_root: Path = typer.Option(
            Path("/"), "--sysfs-root", hidden=True, help="Root of the sysfs tree to read (tests)"
        ),
    ) -> None:
        """Check GPUs (throttling, clocks under load, ECC, NVLink, PCIe), GPU paths, NICs (ports, PCIe AtomicOps,
        NUMA) and CPU affinity; name the slowest GPUs across nodes.

        Example: moelab doctor --json > node.json
        """
        if from_files:
            if save is not None:  # --from probes nothing: there is no snapshot of this host to save
                raise MoelabError("--save writes this host's snapshot and --from judges saved ones: give one")
            snaps = _read_snapshots(from_files)
        else:
            if not 0 <= load_ms <= MAX_LOAD_MS:  # nan fails both comparisons
                raise MoelabError(f"--load-ms must be a number from 0 to {MAX_LOAD_MS:,}, got {load_ms}")
            check_outputs(resolve_db_path(None), {"--save": save})  # the store a run would write (MOELAB_DB)
            snaps = [take(load_ms=load_ms, sysfs_root=sysfs_root)]
            if save is not None:
                save.write_text(json.dumps(snaps[0].to_dict(), indent=2, sort_keys=True) + "\n")
        report = merge(snaps)
        if json_out:
            print(json.dumps(report, indent=2, sort_keys=True))
        else:
            _print_report(report)
        threshold = 1 if strict else 2
        if STATUS_RANK[report["worst"]] >= threshold:
            raise typer.Exit(1)

    return doctor


doctor = build_doctor()
