"""What limits a published row where its own table shows the link carrying more (moelab.model.published:
Limiter, classify): a row of the same table and ranks, differing in one setting, reaching a larger share of
the same bound names the limit, and only rows with no such evidence count as NIC-bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.errors import MoelabError
from moelab.model.links import PeakTable
from moelab.model.published import (
    NIC_TIGHT,
    SIBLING_MARGIN,
    CheckedRow,
    check_row,
    check_tables,
    classify,
    load_rows,
    parse_dataset,
)
from tests.model import synthetic_tables

TABLE = PeakTable()


def _dataset(rows: list[dict[str, Any]], family: str = "hierarchical") -> dict[str, Any]:
    """One table of 16 ranks on two nodes of 8 GPUs with one ConnectX-7 each: its bound is the NIC's."""
    table = {
        "family": family,
        "backends": [],
        "workload": {
            "hidden": 7168,
            "tokens_per_rank": 4096,
            "topk": 8,
            "experts_per_rank": 8,
            "dtype": "bf16",
        },
    }
    rows = [{"table": "t", "ep": 16, "definition": "rdma_pairs", "reason": "synthetic"} | r for r in rows]
    return synthetic_tables.dataset(table, rows)


def _toml(doc: dict[str, Any]) -> str:
    """The synthetic dataset as a published_tables file (JSON scalars are TOML scalars here)."""

    def pairs(d: dict[str, Any]) -> list[str]:
        return [f"{k} = {json.dumps(v)}" for k, v in d.items() if not isinstance(v, dict)]

    table = doc["tables"]["t"]
    inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in table["workload"].items())
    lines = ["[dataset]", *pairs(doc["dataset"]), "[tables.t]", *pairs(table), f"workload = {{ {inline} }}"]
    for r in doc["rows"]:
        lines += ["[[rows]]", *pairs(r)]
    return "\n".join(lines) + "\n"


def _classified(rows: list[dict[str, Any]], family: str = "hierarchical") -> dict[str, CheckedRow]:
    checked = [check_row(r, TABLE) for r in parse_dataset("x", _dataset(rows, family), "x.toml")]
    return {c.row.row_id: c for c in classify(checked)}


def _gbps_at(ratio: float, **row: Any) -> float:
    """The published GB/s that is `ratio` of the row's bound."""
    probe = check_row(parse_dataset("x", _dataset([{"gbps": 1.0} | row]), "x.toml")[0], TABLE)
    assert probe.bound_gbps is not None
    return ratio * probe.bound_gbps


def test_a_row_that_rises_with_sms_is_sm_limited_and_names_its_evidence() -> None:
    row = {"op": "dispatch", "dtype": "bf16", "timing": "kernel"}
    rows = _classified(
        [row | {"sms": 4, "gbps": _gbps_at(0.45, **row)}, row | {"sms": 8, "gbps": _gbps_at(0.77, **row)}]
    )
    low, high = rows["x/t/ep16/dispatch/bf16/sm4/kernel"], rows["x/t/ep16/dispatch/bf16/sm8/kernel"]
    assert low.bound.bottleneck.startswith("nic") and high.bound.bottleneck.startswith("nic")
    assert low.limiter is not None and low.limiter.kind == "sms"
    assert low.limiter.evidence == high.row.row_id and low.limiter.evidence_ratio == pytest.approx(0.77)
    assert (
        not low.nic_bound and low.bottleneck == "sms" and low.to_dict()["link_bottleneck"].startswith("nic")
    )
    assert high.limiter is None and high.nic_bound
    assert "SM-limited" in low.to_dict()["limited_by"]["why"]


def test_fewer_sms_reaching_more_is_no_evidence_of_an_sm_limit() -> None:
    row = {"op": "dispatch", "dtype": "bf16", "timing": "kernel"}
    rows = _classified(
        [row | {"sms": 8, "gbps": _gbps_at(0.9, **row)}, row | {"sms": 16, "gbps": _gbps_at(0.6, **row)}]
    )
    assert rows["x/t/ep16/dispatch/bf16/sm16/kernel"].limiter is None
    assert rows["x/t/ep16/dispatch/bf16/sm16/kernel"].nic_bound


@pytest.mark.parametrize(
    ("low", "high", "kind"),
    [
        # the torch API time holds the kernel's: its gap is time outside the transfer
        (
            {"op": "dispatch", "dtype": "bf16", "timing": "torch-api"},
            {"op": "dispatch", "dtype": "bf16", "timing": "kernel"},
            "api-overhead",
        ),
        # FP8 carries about half of BF16's bytes per token through the same ranks and NIC
        ({"op": "dispatch", "dtype": "fp8"}, {"op": "dispatch", "dtype": "bf16"}, "per-token"),
        # the combine moves the dispatch's rows back in BF16: same bytes per row
        ({"op": "combine"}, {"op": "dispatch", "dtype": "bf16"}, "combine-path"),
    ],
)
def test_each_setting_names_its_limit(low: dict[str, Any], high: dict[str, Any], kind: str) -> None:
    rows = classify(
        [
            check_row(r, TABLE)
            for r in parse_dataset(
                "x",
                _dataset([low | {"gbps": _gbps_at(0.4, **low)}, high | {"gbps": _gbps_at(0.8, **high)}]),
                "x",
            )
        ]
    )
    assert rows[0].limiter is not None and rows[0].limiter.kind == kind, rows[0].row.row_id
    assert rows[1].limiter is None


def test_low_latency_dispatch_below_its_combine_is_per_message() -> None:
    rows = _classified(
        [
            {"op": "dispatch", "dtype": "fp8", "gbps": 10.0, "definition": "ll_selections"},
            {"op": "combine", "dtype": "fp8", "gbps": 30.0, "definition": "ll_selections"},
        ],
        family="low_latency",
    )
    dispatch = rows["x/t/ep16/dispatch/fp8"]
    assert dispatch.ratio * SIBLING_MARGIN <= rows["x/t/ep16/combine/fp8"].ratio
    assert dispatch.limiter is not None and dispatch.limiter.kind == "per-message"


def test_a_sibling_within_the_margin_is_no_evidence() -> None:
    row = {"op": "dispatch", "dtype": "bf16", "timing": "kernel"}
    rows = _classified(
        [row | {"sms": 4, "gbps": _gbps_at(0.70, **row)}, row | {"sms": 8, "gbps": _gbps_at(0.72, **row)}]
    )
    assert rows["x/t/ep16/dispatch/bf16/sm4/kernel"].limiter is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=2, max_size=5))
def test_an_sm_sweep_is_limited_exactly_where_more_sms_reach_the_margin_more(ratios: list[float]) -> None:
    row = {"op": "dispatch", "dtype": "bf16", "timing": "kernel"}
    sms = [4 * 2**i for i in range(len(ratios))]
    rows = _classified(
        [row | {"sms": s, "gbps": _gbps_at(r, **row)} for s, r in zip(sms, ratios, strict=True)]
    )

    def at(s: int) -> CheckedRow:
        return rows[f"x/t/ep16/dispatch/bf16/sm{s}/kernel"]

    for s in sms:
        c = at(s)
        shown = [at(t).ratio for t in sms if t > s and at(t).ratio >= c.ratio * SIBLING_MARGIN]
        assert (c.limiter is not None) == bool(shown)
        if c.limiter:
            assert c.limiter.kind == "sms" and c.limiter.evidence_ratio == pytest.approx(max(shown))


def test_the_published_nic_rows_under_0_7_are_the_ones_no_sibling_explains() -> None:
    """Issue 35: where the NIC is the bottleneck, published over bound is at least 0.7, or the row carries
    its sourced reason; the rows the tables' own evidence classifies elsewhere are no longer NIC-bound."""
    checked = [c for t in check_tables(load_rows(), TABLE) for c in t.checked]
    by_id = {c.row.row_id: c for c in checked}
    low_nic = sorted(c.row.row_id for c in checked if c.nic_bound and c.ratio < NIC_TIGHT)
    assert all(by_id[i].row.reason for i in low_nic)
    # AWS's EFA comparison pages give backend-native figures with no setting to tell limits apart
    assert len([i for i in low_nic if i.startswith("aws-ep-comparison")]) == 8
    assert [i for i in low_nic if not i.startswith("aws-ep-comparison")] == [
        "hybrid-ep-h100/h100/ep16/dispatch/fp8/sm16/kernel",
        "uccl-ep-p5en/low_latency/ep16/combine",
        "uccl-ep-p5en/low_latency/ep24/combine",
        "uccl-ep-p5en/low_latency/ep32/combine",
        "uccl-ep-p5en/normal/ep16/dispatch",
        "uccl-ep-p6-b200/normal/ep16/combine",
    ]
    kinds = {
        "hybrid-ep-h100/h100/ep16/dispatch/bf16/sm4/kernel": "sms",
        "hybrid-ep-h100/h100/ep16/dispatch/bf16/sm8/torch-api": "api-overhead",
        "hybrid-ep-h100/h100/ep16/dispatch/fp8/sm8/kernel": "per-token",
        "uccl-ep-p5en/normal/ep16/combine": "combine-path",
        "uccl-ep-p5en/low_latency/ep16/dispatch": "per-message",
        "deepep-v1/low_latency/ep16/dispatch": "per-message",
    }
    for row_id, kind in kinds.items():
        limit = by_id[row_id].limiter
        assert limit is not None and limit.kind == kind, row_id
        assert by_id[limit.evidence].ratio >= by_id[row_id].ratio * SIBLING_MARGIN


def test_a_row_of_a_time_alone_is_held_by_its_time_and_a_roundtrip_by_both_ops() -> None:
    rows = [
        {"op": "dispatch", "time_us": 3000.0},
        {"op": "roundtrip", "time_us": 5000.0},
    ]
    doc = _dataset([])
    doc["rows"] = [{"table": "t", "ep": 16} | r for r in rows]
    one, both = (check_row(r, TABLE) for r in parse_dataset("x", doc, "x.toml"))
    assert one.row.gbps is None and one.bound_gbps is None and one.implied_bytes is None
    assert one.ratio == pytest.approx(one.bound.time_us / 3000.0)
    assert both.then is not None and both.then.op == "combine" and both.bound.op == "dispatch"
    assert both.bound_time_us == pytest.approx(both.bound.time_us + both.then.time_us)
    assert both.ratio == pytest.approx(both.bound_time_us / 5000.0)
    fast = parse_dataset(
        "x", doc | {"rows": [{"table": "t", "ep": 16, "op": "roundtrip", "time_us": 1.0}]}, "x"
    )
    assert "is under its bound" in (check_row(fast[0], TABLE).problem or "")


@pytest.mark.parametrize(
    "row",
    [
        {"op": "roundtrip", "gbps": 10.0, "definition": "rdma_pairs"},  # no definition counts both ops
        {"op": "dispatch", "time_us": 10.0, "definition": "rdma_pairs"},  # a definition without its bandwidth
        {"op": "dispatch"},  # neither a bandwidth nor a time
        {"op": "dispatch", "gbps": 10.0},  # a bandwidth without its definition
    ],
)
def test_a_row_gives_a_bandwidth_with_its_definition_or_a_time(row: dict[str, Any]) -> None:
    doc = _dataset([])
    doc["rows"] = [{"table": "t", "ep": 16} | row]
    with pytest.raises(MoelabError, match="row"):
        parse_dataset("x", doc, "x.toml")


def test_aws_comparison_tables_are_built_in_as_published() -> None:
    rows = {r.row_id: r for r in load_rows() if r.dataset.startswith("aws-ep-comparison")}
    fair = "aws-ep-comparison-p6-b200/fair_decode_"
    assert rows[f"{fair}uccl/ep16/roundtrip/fp8"].time_us == 521.3
    assert rows[f"{fair}deepep_v1/ep32/roundtrip/bf16"].time_us == 1558.9
    assert rows[f"{fair}deepep_v2/ep16/roundtrip/bf16"].time_us == 485.0
    combine = rows["aws-ep-comparison-p6-b200/native_prefill_deepep_v1/ep16/combine"]
    assert (combine.gbps, combine.time_us, combine.definition) == (78.62, 1633.22, "rdma_pairs")
    p5 = "aws-ep-comparison-p5/internode_deepep_v1/ep32/"
    assert (rows[p5 + "dispatch"].gbps, rows[p5 + "combine"].gbps) == (43.7, 46.1)
    assert all(r.repository == "https://github.com/awslabs/awsome-distributed-ai" for r in rows.values())
    assert len(rows) == 12 + 18 + 16


def test_check_published_names_each_rows_limit_through_the_command(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["model", "--check-published", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {r["id"]: r for r in doc["rows"]}
    sm4 = rows["hybrid-ep-h100/h100/ep16/dispatch/bf16/sm4/kernel"]
    assert sm4["bottleneck"] == "sms" and sm4["link_bottleneck"] == "nic recv" and not sm4["nic_bound"]
    assert sm4["limited_by"]["evidence"] == "hybrid-ep-h100/h100/ep16/dispatch/bf16/sm8/kernel"
    under = doc["summary"]["nic_bound_under_tight"]
    assert under and all(u["reason"] and u["ratio"] < NIC_TIGHT for u in under)
    assert {u["id"] for u in under} == {
        r["id"] for r in doc["rows"] if r["nic_bound"] and r["ratio"] < NIC_TIGHT
    }
    assert sum(doc["summary"]["limited_elsewhere"].values()) == sum(1 for r in doc["rows"] if r["limited_by"])
    text = CliRunner().invoke(app, ["model", "--check-published"], env={"COLUMNS": "250"})
    assert text.exit_code == 0 and "SM-limited" in text.stdout


@pytest.mark.parametrize(("with_sibling", "exit_code"), [(True, 0), (False, 1)])
def test_a_low_nic_row_passes_the_command_only_with_evidence_or_a_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, with_sibling: bool, exit_code: int
) -> None:
    """A NIC-bound row at 0.6 with no reason fails `--check-published`; the same row beside its table's
    row at more SMs reaching 0.8 is SM-limited and passes."""
    row = {"op": "dispatch", "dtype": "bf16", "timing": "kernel"}
    rows = [row | {"sms": 4, "gbps": _gbps_at(0.6, **row)}]
    if with_sibling:
        rows.append(row | {"sms": 8, "gbps": _gbps_at(0.8, **row)})
    doc = _dataset(rows)
    for r in doc["rows"]:
        del r["reason"]
    path = tmp_path / "x.toml"
    path.write_text(_toml(doc))
    monkeypatch.setattr("moelab.model.published.dataset_paths", lambda: {"x": path})
    res = CliRunner().invoke(app, ["model", "--check-published", "--json"])
    assert res.exit_code == exit_code, res.output
    if not with_sibling:
        assert "under 0.7 and the row gives no reason" in res.stderr


def test_another_library_on_the_same_page_doing_the_op_faster_is_implementation() -> None:
    """AWS's pages measure several libraries on one set of nodes and one workload: a library whose row
    reaches less of the same bound than another's (same definition), or takes longer at the page's common
    boundary (times alone), is limited by itself, not by the card."""
    checked = {c.row.row_id: c for t in check_tables(load_rows(), TABLE) for c in t.checked}
    uccl = checked["aws-ep-comparison-p6-b200/native_prefill_uccl/ep16/combine"]
    assert uccl.limiter is not None and uccl.limiter.kind == "implementation"
    assert uccl.limiter.evidence == "aws-ep-comparison-p6-b200/native_prefill_deepep_v1/ep16/combine"
    assert uccl.limiter.evidence_ratio >= uccl.ratio * SIBLING_MARGIN and not uccl.nic_bound
    v1 = checked["aws-ep-comparison-p6-b200/fair_decode_deepep_v1/ep16/roundtrip/bf16"]
    assert v1.limiter is not None and v1.limiter.kind == "implementation"
    assert v1.limiter.evidence_time_us == 485.0 and "takes 485 us" in v1.limiter.text
    # the fastest at a common boundary has no such evidence; V2's latency alone is not compared with the
    # other libraries' native latencies, whose boundaries differ (the page says so)
    fastest = checked["aws-ep-comparison-p6-b200/fair_decode_deepep_v2/ep16/roundtrip/bf16"]
    assert fastest.limiter is None and fastest.nic_bound and fastest.row.reason
    v2_prefill = checked["aws-ep-comparison-p6-b200/native_prefill_deepep_v2/ep16/combine"]
    assert v2_prefill.limiter is None


@pytest.mark.parametrize(("tokens", "classified"), [(4096, True), (2048, False)])
def test_implementation_compares_libraries_only_on_the_same_workload(tokens: int, classified: bool) -> None:
    row = {"op": "dispatch", "dtype": "bf16"}
    doc = _dataset([row | {"gbps": _gbps_at(0.5, **row)}])
    other = json.loads(json.dumps(doc["tables"]["t"]))
    other["workload"]["tokens_per_rank"] = tokens
    doc["tables"]["u"] = other
    doc["rows"].append({"table": "u", "ep": 16, "definition": "rdma_pairs", "gbps": 1000.0} | row)
    doc["rows"][-1]["gbps"] = _gbps_at(0.9, **row)  # 0.9 of the 4096-token bound
    (t,) = [c for c in check_tables(parse_dataset("x", doc, "x.toml"), TABLE) if c.table == "t"]
    (low,) = t.checked
    assert (low.limiter is not None and low.limiter.kind == "implementation") is classified
