"""A brute-force oracle for moelab.model.traffic: every token's destinations as Python sets, every row and
message walked one by one, independent of the model's tensor code."""

from __future__ import annotations

from collections.abc import Sequence

from moelab.core.routing import Routing
from moelab.model.traffic import DEFINITION_FIELDS, FAMILIES

LINKS = ("intra_send", "intra_recv", "nic_send", "nic_recv")


def brute_force(
    routings: Sequence[Routing], epr: int, g: int
) -> tuple[list[dict[str, int]], dict[str, dict[str, list[int]]]]:
    """(per rank: rows by definition field, per family and link: rows per rank)."""
    world = len(routings)
    defs = [dict.fromkeys(DEFINITION_FIELDS, 0) for _ in range(world)]
    links = {f: {k: [0] * world for k in LINKS} for f in FAMILIES}

    def move(family: str, src: int, dst: int) -> None:
        if src == dst:
            return
        kind = "intra" if src // g == dst // g else "nic"
        links[family][f"{kind}_send"][src] += 1
        links[family][f"{kind}_recv"][dst] += 1

    for s, routing in enumerate(routings):
        for row in routing.topk_idx.tolist():
            dests = {e // epr for e in row}
            for d in dests:
                defs[d]["recv_rows"] += 1
                defs[d]["recv_rows_remote"] += d != s
                defs[s]["send_rows"] += 1
                defs[s]["send_rows_remote"] += d != s
                move("flat", s, d)
            dest_nodes = {d // g for d in dests}
            defs[s]["rdma_pairs"] += len(dest_nodes)
            defs[s]["rdma_pairs_remote"] += len(dest_nodes - {s // g})
            for n in dest_nodes:
                entry = n * g + s % g
                move("hierarchical", s, entry)  # across nodes only: the own node's entry is s itself
                for d in dests:
                    if d // g == n and d != entry:
                        links["hierarchical"]["intra_send"][entry] += 1
                        links["hierarchical"]["intra_recv"][d] += 1
            for e in row:
                defs[s]["selections"] += 1
                move("low_latency", s, e // epr)
    return defs, links
