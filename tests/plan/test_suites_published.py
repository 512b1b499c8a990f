"""Suites at published configurations: a total `experts` divided over each run's ranks, DeepSeek-V3's
group-limited routing, and each case matched to the published row of its configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.errors import SpecError
from moelab.core.routing import route, route_all
from moelab.core.workload import RoutingSpec, Workload
from moelab.reports.bounds import published_for
from moelab.suites.loader import expand, load_suite, parse_suite


def _fields(case, world: int, op: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    wl = case.workload
    return {
        "backend": case.backend,
        "op": op,
        "world": world,
        "hidden": wl.hidden,
        "tokens_per_rank": wl.tokens_per_rank,
        "topk": wl.topk,
        "experts_per_rank": wl.experts_per_rank,
        "dtype": wl.dtype,
        "routing": wl.routing.kind,
    }


@pytest.mark.parametrize(("world", "epr"), [(8, 32), (16, 16), (32, 8), (64, 4)])
def test_the_normal_suite_is_deepeps_configuration_at_each_ep(world: int, epr: int) -> None:
    (case,) = expand(load_suite("deepep-v1-normal"), ["deepep"], world)
    wl = case.workload
    assert (wl.hidden, wl.tokens_per_rank, wl.topk, wl.experts_per_rank, wl.dtype) == (
        7168,
        4096,
        8,
        epr,
        "fp8",
    )
    assert wl.routing.kind == "grouped" and wl.routing.groups_per_token(world) == min(4, world // 8)
    assert case.skip_reason is None
    rows = [p for op in ("dispatch", "combine") for p in published_for(_fields(case, world, op))]
    assert [(p.ep, p.op) for p in rows] == [(world, "dispatch"), (world, "combine")]


@pytest.mark.parametrize("world", [8, 16, 32, 64, 128, 256])
def test_the_low_latency_suite_matches_every_published_ep(world: int) -> None:
    (case,) = expand(load_suite("deepep-v1-ll"), ["deepep-ll"], world)
    assert case.workload.experts_per_rank * world == 256 and case.workload.tokens_per_rank == 128
    rows = published_for(_fields(case, world, "dispatch"))
    assert [(p.table, p.ep) for p in rows] == [("low_latency", world)]


def test_a_world_that_does_not_divide_the_experts_is_a_skipped_case() -> None:
    (case,) = expand(load_suite("deepep-v1-ll"), ["deepep-ll"], 24)
    assert case.skip_reason == "256 experts do not divide over 24 ranks"
    # a value set per rank (a flag) wins over the suite's total
    (flag,) = expand(load_suite("deepep-v1-ll"), ["deepep-ll"], 24, {"experts_per_rank": [4]})
    assert flag.workload.experts_per_rank == 4 and flag.skip_reason is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "[workload]\nexperts = 64\nexperts_per_rank = 2\n",
            "sets both experts (total) and experts_per_rank",
        ),
        ("[workload]\nexperts = 'many'\n", "experts must be a positive integer (total experts), got 'many'"),
    ],
)
def test_bad_experts_is_one_error(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        expand(parse_suite(__import__("tomllib").loads(text), "s.toml"), ["nccl-a2a"], 4)


def test_routing_keys_of_grouped_routing_load(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        '[workload]\nhidden = 128\ntokens_per_rank = 8\ntopk = 2\nexperts_per_rank = 2\nrouting = "grouped"\n'
        "group_ranks = 2\ntopk_groups = 1\n"
    )
    (case,) = expand(load_suite(str(path)), ["nccl-a2a"], 4)
    assert case.workload.routing == RoutingSpec(kind="grouped", group_ranks=2, topk_groups=1)
    assert "grouped1of2r" in case.case_id


@settings(max_examples=40, deadline=None)
@given(
    group_ranks=st.sampled_from([1, 2, 4]),
    groups=st.integers(1, 4),
    topk_groups=st.integers(1, 4),
    epr=st.integers(1, 4),
    seed=st.integers(0, 9),
)
def test_grouped_routing_keeps_each_token_in_its_best_groups(
    group_ranks: int, groups: int, topk_groups: int, epr: int, seed: int
) -> None:
    world = group_ranks * groups
    reach = min(topk_groups, groups) * group_ranks * epr
    wl = Workload(
        hidden=64,
        tokens_per_rank=32,
        topk=min(4, reach),
        experts_per_rank=epr,
        routing=RoutingSpec(kind="grouped", seed=seed, group_ranks=group_ranks, topk_groups=topk_groups),
    )
    wl.validate(world)
    for rank, r in enumerate(route_all(wl, world)):
        assert torch.equal(
            r.topk_idx, route(wl, rank, world).topk_idx
        )  # deterministic in (seed, rank, world)
        per_group = group_ranks * epr
        for row in r.topk_idx.tolist():
            assert len(set(row)) == len(row) and all(0 <= e < world * epr for e in row)
            assert len({e // per_group for e in row}) <= min(topk_groups, groups)


def test_grouped_routing_errors_say_what_works() -> None:
    with pytest.raises(SpecError, match="6 ranks are not groups of group_ranks 4"):
        Workload(routing=RoutingSpec(kind="grouped", group_ranks=4)).validate(6)
    with pytest.raises(SpecError, match="topk 8 > the 4 experts of 1 group"):
        Workload(
            experts_per_rank=2, routing=RoutingSpec(kind="grouped", group_ranks=2, topk_groups=1)
        ).validate(4)
    with pytest.raises(SpecError, match="topk_groups must be a positive integer"):
        Workload(routing=RoutingSpec(kind="grouped", topk_groups=0)).validate(8)


def test_a_grouped_row_matches_only_its_own_grouping() -> None:
    (case,) = expand(load_suite("deepep-v1-normal"), ["deepep"], 64)
    fields = _fields(case, 64, "dispatch")
    params = case.workload.to_dict()["routing"]
    assert [p.ep for p in published_for({**fields, "routing_params": params})] == [64]
    assert published_for({**fields, "routing_params": {**params, "topk_groups": 2}}) == []
    assert (
        published_for({**fields, "routing": "uniform", "routing_params": {}}) == []
    )  # EP64 limits to 4 of 8 nodes
    (ep16,) = expand(load_suite("deepep-v1-normal"), ["deepep"], 16)
    uniform = {**_fields(ep16, 16, "dispatch"), "routing": "uniform", "routing_params": {}}
    assert [p.ep for p in published_for(uniform)] == [16]  # both groups kept: uniform routing
