"""A figure above 100% of its bound or its peak is a finding, never a silent number.

A bound or a peak that a measurement beats is wrong somewhere, and the three ways it goes wrong read
differently: the peak is not the capacity of the bytes counted (`peak definition`: a copy to one neighbour
held against traffic to several peers, NCCL's own all_to_all as "the hardware"), the bound assumed links
the machine does not have (`topology mismatch`: a NIC between ranks that share one host), or the time is
shorter than the bytes allow (`timing artefact`: the slowest rank not timed, iterations overlapping). The
report, `moelab run`, `moelab compare` and the gate name the cause with the figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PEAK_DEFINITION = "peak definition"
TOPOLOGY_MISMATCH = "topology mismatch"
TIMING_ARTEFACT = "timing artefact"
CAUSES = (PEAK_DEFINITION, TOPOLOGY_MISMATCH, TIMING_ARTEFACT)

# figure key of a result row -> what it is called where it is printed
FIGURES = {"frac_bound": "% bound", "frac_remote": "% peak", "frac_remote_measured": "% measured"}


@dataclass(frozen=True, kw_only=True, slots=True)
class AboveFinding:
    figure: str  # "% bound", "% peak" or "% measured"
    fraction: float
    cause: str  # one of CAUSES
    why: str  # the sentence that names what the bound or peak assumed

    def text(self) -> str:
        return f"{self.figure} {100 * self.fraction:.0f}% is above 100%: {self.cause}: {self.why}"


def _bound_cause(r: Mapping[str, Any]) -> tuple[str, str]:
    nodes, hosts = r.get("bound_nodes"), r.get("hosts")
    if nodes and hosts and nodes > hosts:
        nic = r.get("bound_nic") or "a NIC"
        return (
            TOPOLOGY_MISMATCH,
            f"the bound assumed {nodes} nodes joined by {nic}, a NIC the host lacks: its {r.get('world')} "
            f"ranks ran on {hosts} host{'s' if hosts > 1 else ''} (emulated nodes?)",
        )
    if r.get("bound_intra_measured"):
        return (
            PEAK_DEFINITION,
            "the bound's link figure is a measured copy, lower than what the GPU moves to all its peers at once",
        )
    return (
        TIMING_ARTEFACT,
        "the bytes cannot cross faster than the link's rate: is the slowest rank timed, do iterations overlap?",
    )


def _peak_cause(r: Mapping[str, Any]) -> tuple[str, str]:
    if r.get("peak_basis") == "NVML":
        return (
            TIMING_ARTEFACT,
            f"nvl_remote cannot cross faster than the {r.get('peak_link')} NVML reported: is the slowest rank timed?",
        )
    return (
        PEAK_DEFINITION,
        f"the peak is the datasheet figure of the GPU's name ({r.get('peak_link')}), not what its machine reported",
    )


def _measured_cause(r: Mapping[str, Any]) -> tuple[str, str]:
    return (
        PEAK_DEFINITION,
        "the measured peak is a large NCCL exchange at the start of the run, what NCCL achieves, not the "
        "link's capacity: a backend may beat it",
    )


CAUSE_OF = {"frac_bound": _bound_cause, "frac_remote": _peak_cause, "frac_remote_measured": _measured_cause}


def above_findings(r: Mapping[str, Any]) -> list[AboveFinding]:
    """Every figure of one result row (moelab.reports.query.results, annotated by the report) above 100%,
    each with its likely cause: `frac_bound` (bound / measured time), `frac_remote` (nvl_remote / link
    peak), `frac_remote_measured` (nvl_remote / the run's measured peak)."""
    out = []
    for key, name in FIGURES.items():
        value = r.get(key)
        if value is not None and value > 1.0:
            cause, why = CAUSE_OF[key](r)
            out.append(AboveFinding(figure=name, fraction=float(value), cause=cause, why=why))
    return out
