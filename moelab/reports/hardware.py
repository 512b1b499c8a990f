"""Each job's link peak from what its machine reported, not from its GPU's name.

A run stores a health snapshot (NVML: active NVLink links, their version and speed, the PCIe link) before
each backend job. The peak a bandwidth is held against comes from there: the active NVLink links, else the
PCIe link (moelab.model.links.reported_link). The datasheet figure of the GPU's name is the fallback where
no NVML reading was stored (`--no-health`, a CPU run, an old export), and is labelled so; an entry of a
user peaks file (`--peaks`) wins over both, since the user said so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from moelab.model.links import LinkFacts, LinkPeak, PeakTable, reported_link

DATASHEET_NOTE = "datasheet fallback: no NVML link reading stored with this run"


def gpu_facts(snapshot: dict[str, Any]) -> LinkFacts | None:
    """The link facts of the snapshot's GPU (the rank's own when it says which, else the first), or None
    when NVML read no GPU."""
    gpus = snapshot.get("gpus") or []
    if not snapshot.get("nvml_available") or not gpus:
        return None
    index = snapshot.get("local_gpu")
    gpu = next((g for g in gpus if g.get("index") == index), gpus[0]) if index is not None else gpus[0]
    links = [link for link in gpu.get("nvlinks") or [] if link.get("active")]
    return LinkFacts(
        nvlinks_active=len(links),
        nvlink_version=links[0].get("version") if links else None,
        nvlink_speed_mbps=gpu.get("nvlink_speed_mbps"),
        pcie_gen=gpu.get("pcie_gen_max") or gpu.get("pcie_gen"),
        pcie_width=gpu.get("pcie_width_max") or gpu.get("pcie_width"),
    )


@dataclass(frozen=True, slots=True)
class JobLinks:
    """The link peak of every (run, backend) job: `get(run_id, backend)`."""

    peaks: dict[tuple[str, str], LinkPeak | None] = field(default_factory=dict)

    def get(self, run_id: str, backend: str) -> LinkPeak | None:
        return self.peaks.get((run_id, backend))


def _snapshot(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def job_links(
    snapshots: Iterable[dict[str, Any]], environment: Sequence[dict[str, Any]], table: PeakTable
) -> JobLinks:
    """snapshots: rows with run_id, backend, phase and snapshot (query.health_snapshots); environment: the
    ranks' rows (gpu_name). A CPU job has no link peak."""
    facts: dict[tuple[str, str], LinkFacts] = {}
    for s in sorted(snapshots, key=lambda s: s.get("phase") != "before"):  # before the job first
        found = gpu_facts(_snapshot(s.get("snapshot")))
        if found is not None:
            facts.setdefault((s["run_id"], s["backend"]), found)
    out: dict[tuple[str, str], LinkPeak | None] = {}
    for e in environment:
        key = (e["run_id"], e["backend"])
        if key not in out:
            out[key] = _peak(e.get("gpu_name"), facts.get(key), table)
    return JobLinks(out)


def _peak(gpu_name: str | None, facts: LinkFacts | None, table: PeakTable) -> LinkPeak | None:
    if not gpu_name:
        return None
    user = table.user_gpu(gpu_name)
    if user is not None:
        return user
    reported = reported_link(facts) if facts is not None else None
    if reported is not None:
        return reported
    sheet = table.gpu(gpu_name)
    return None if sheet is None else replace(sheet, source=f"{DATASHEET_NOTE} ({sheet.source})")


def basis(peak: LinkPeak | None) -> str:
    """Where a peak came from, in a word: NVML, datasheet or the user's peaks file."""
    if peak is None:
        return "none"
    if peak.source.startswith("NVML"):
        return "NVML"
    return "datasheet" if peak.source.startswith(DATASHEET_NOTE) else "peaks file"
