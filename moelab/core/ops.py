"""The ops a dispatch/combine case times, each with the definition stored beside its numbers.

The split follows what a user can act on: the routing/layout step (count and metadata exchange, any host
synchronisation), the payload transfer with the layout known (what a cached handle or a backward pass
pays), combine, and the two a training step with fresh routing pays back to back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class OpDefinition:
    name: str
    text: str
    needs_phases: bool  # only a backend that splits layout from payload can time it alone


OPS: dict[str, OpDefinition] = {
    d.name: d
    for d in (
        OpDefinition(
            name="layout",
            needs_phases=True,
            text="the routing/layout step alone: from topk ids to what the payload transfer needs (per-rank counts, their exchange, metadata, any host synchronisation); the backend's layout() call",
        ),
        OpDefinition(
            name="dispatch",
            needs_phases=True,
            text="the payload transfer with the layout known (cached layout/handle of the same routing): the steady state, what a backward pass or a cached-handle dispatch pays; the path DeepEP's and Hybrid-EP's own tests time",
        ),
        OpDefinition(
            name="dispatch_fresh",
            needs_phases=False,
            text="layout + dispatch from fresh routing in one call: what a forward pass with new routing pays for dispatch",
        ),
        OpDefinition(
            name="combine",
            needs_phases=False,
            text="rows back to their source tokens, summed over their experts, along the dispatch's handle",
        ),
        OpDefinition(
            name="roundtrip",
            needs_phases=False,
            text="dispatch_fresh then combine back to back: a training step's layer communication with fresh routing",
        ),
    )
}


def ops_for(phases: bool) -> tuple[str, ...]:
    """The ops timed for a backend: all five when it splits layout from payload, else the three it can."""
    return tuple(name for name, d in OPS.items() if phases or not d.needs_phases)
