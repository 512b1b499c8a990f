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
    needs_chaining: bool = False  # only a backend whose calls chain without a host sync (ChainedPairs)


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
        OpDefinition(
            name="pair",
            needs_phases=False,
            needs_chaining=True,
            text="dispatch then combine chained back to back with no host synchronisation between or inside them (dispatch along the known layout where the backend splits phases, else whole), K pairs per timed iteration; the time is the pair period, the iteration's time over K (CollectiveX's pair period); only where the backend's calls chain (capability ChainedPairs)",
        ),
    )
}


def ops_for(phases: bool, chains: bool = False) -> tuple[str, ...]:
    """The ops timed for a backend: layout and dispatch only when it splits layout from payload, the
    chained pair only when its dispatch and combine hold no host sync (ChainedPairs)."""
    return tuple(
        name for name, d in OPS.items() if (phases or not d.needs_phases) and (chains or not d.needs_chaining)
    )
