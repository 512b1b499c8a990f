"""The published tables as data (moelab/model/published_tables/*.toml): the figures, their sources, and each row
held against the bound of its own hardware."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from moelab.core.errors import MoelabError
from moelab.model.links import PeakTable
from moelab.model.published import LOW_RATIO, NIC_TIGHT, check_row, check_tables, load_rows, parse_dataset
from tests.model import synthetic_tables

# DeepEP's tables as issue 28 lists them (docs/legacy.md of deepseek-ai/DeepEP)
NORMAL = {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}
LOW_LATENCY = {  # EP: (dispatch us, GB/s, combine us, GB/s)
    8: (77, 98, 114, 127),
    16: (118, 63, 195, 74),
    32: (155, 48, 273, 53),
    64: (173, 43, 314, 46),
    128: (192, 39, 369, 39),
    256: (194, 39, 360, 40),
}


@pytest.fixture(scope="module")
def checked() -> list[Any]:
    """Every row as `moelab model --check-published` holds it: classified by its own table's evidence."""
    return [c for t in check_tables(load_rows(), PeakTable()) for c in t.checked]


def test_the_deepep_tables_are_stored_as_published() -> None:
    rows = {(r.table, r.ep, r.op): r for r in load_rows() if r.dataset == "deepep-v1"}
    for ep, (dispatch, combine) in NORMAL.items():
        assert (rows[("normal", ep, "dispatch")].gbps, rows[("normal", ep, "combine")].gbps) == (
            dispatch,
            combine,
        )
        assert rows[("normal", ep, "dispatch")].definition == ("nvl_recv" if ep == 8 else "rdma_pairs")
    for ep, (d_us, d_gbps, c_us, c_gbps) in LOW_LATENCY.items():
        d, c = rows[("low_latency", ep, "dispatch")], rows[("low_latency", ep, "combine")]
        assert (d.time_us, d.gbps, c.time_us, c.gbps) == (d_us, d_gbps, c_us, c_gbps)
        assert d.definition == c.definition == "ll_selections"
    assert len(rows) == 2 * (len(NORMAL) + len(LOW_LATENCY))


def test_every_row_says_where_it_comes_from() -> None:
    for r in load_rows():
        assert r.library and r.document and r.repository.startswith("https://github.com/")
        assert re.fullmatch(r"[0-9a-f]{40}", r.commit) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", r.date)
        assert r.test and r.hardware_text and r.version
    deepep = [r for r in load_rows() if r.library == "DeepEP"]
    assert all("v1.2.1" in r.version and "H800" in r.hardware_text for r in deepep)
    assert {r.commit[:7] for r in deepep} == {"3b1045d", "de8cfca"}


def test_no_published_row_is_above_its_bound(checked: list[Any]) -> None:
    assert all(c.ratio <= 1.0 for c in checked), [(c.row.row_id, c.ratio) for c in checked if c.ratio > 1]
    assert all(c.problem is None for c in checked)
    low = [c for c in checked if c.ratio < LOW_RATIO]
    assert all(c.row.reason for c in low)


def test_low_latency_rows_imply_the_models_bytes(checked: list[Any]) -> None:
    """A row with a time and a bandwidth implies its bytes. DeepEP's test masks 10 of its 1024 selections to
    -1 (tests/test_low_latency.py: `topk_idx[random token, random k] = -1`, ten times), so its bytes are
    about 1% under the model's; the rest is the rounding of two-digit figures (under 1.3%)."""
    for c in checked:
        if c.implied_bytes is not None and c.row.dataset == "deepep-v1":
            masked = c.bound.definitions[c.row.definition] * (1 - 10 / (128 * 8))
            assert c.implied_bytes == pytest.approx(masked, rel=0.013), c.row.row_id


def test_the_bottlenecks_are_the_links_expected(checked: list[Any]) -> None:
    by_id = {c.row.row_id: c for c in checked}
    assert by_id["deepep-v1/normal/ep8/dispatch"].bound.bottleneck.startswith("nvlink")
    assert by_id["deepep-v1/normal/ep16/dispatch"].bound.bottleneck.startswith(
        "nvlink"
    )  # H800's 8 links forward
    assert by_id["deepep-v1/normal/ep64/dispatch"].bound.bottleneck.startswith("nic")
    assert by_id["deepep-v1/low_latency/ep256/combine"].bound.bottleneck.startswith("nic")


def _doc(**row: Any) -> dict[str, Any]:
    base = {"table": "t", "ep": 8, "op": "dispatch", "gbps": 1.0, "definition": "nvl_recv"}
    table = {
        "history": "",
        "family": "flat",
        "backends": ["nccl-a2a"],
        "workload": {"hidden": 1024, "tokens_per_rank": 256, "topk": 8, "experts": 64, "dtype": "bf16"},
    }
    return synthetic_tables.dataset(table, [base | row])


def test_a_row_above_its_bound_is_a_problem_and_a_low_row_needs_a_reason() -> None:
    high = check_row(parse_dataset("x", _doc(gbps=10_000.0), "x.toml")[0], PeakTable())
    assert high.ratio > 1 and high.problem and "above its bound" in high.problem
    low = check_row(parse_dataset("x", _doc(gbps=1.0), "x.toml")[0], PeakTable())
    assert low.ratio < LOW_RATIO and low.problem and "gives no reason" in low.problem
    explained = check_row(parse_dataset("x", _doc(gbps=1.0, reason="host-bound"), "x.toml")[0], PeakTable())
    assert explained.problem is None


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"color": "red"}, "unknown keys"),
        ({"table": "nope"}, "no table 'nope'"),
        ({"op": "shuffle"}, "unknown"),
    ],
)
def test_a_malformed_dataset_is_one_error(row: dict[str, Any], needle: str, tmp_path: Path) -> None:
    with pytest.raises(MoelabError, match=needle):
        parse_dataset("x", _doc(**row), "x.toml")


def test_every_public_table_is_built_in_and_holds(checked: list[Any]) -> None:
    """Issue 35's acceptance: at least 150 published rows from at least 6 tables held, none above its bound,
    every NIC-bound row at 0.7 of its bound or with its reason."""
    tables = {(c.row.dataset, c.row.table) for c in checked}
    assert len(checked) >= 150 and len(tables) >= 6
    assert {c.row.library for c in checked} >= {"DeepEP", "DeepEP V2", "Hybrid-EP", "NCCL EP", "UCCL-EP"}
    assert all(c.ratio <= 1.0 and c.problem is None for c in checked)
    assert all(c.ratio >= NIC_TIGHT or c.row.reason for c in checked if c.nic_bound)
    datasets = {c.row.dataset for c in checked}
    assert {
        "hybrid-ep-h100",
        "hybrid-ep-b200",
        "hybrid-ep-gb200",
        "nccl-ep",
        "uccl-ep-p5en",
        "uccl-ep-p6-b200",
    } <= datasets
    assert {"deepep-v2-sm90", "deepep-v2-sm100"} <= datasets


def test_rows_the_model_cannot_express_say_why() -> None:
    rows = [r for r in load_rows() if r.unexpressed]
    assert rows and all(len(r.unexpressed) > 20 for r in rows)  # type: ignore[arg-type]
    assert {r.dataset for r in rows} == {"uccl-ep-p5en", "uccl-ep-p6-b200"}
    assert any("EP24" in r.unexpressed for r in rows)  # type: ignore[operator]


def test_each_backends_family_holds_against_its_own_published_table() -> None:
    """A backend named by a published table is of that table's family (moelab.backends: dispatch_family),
    and says where its family is stated."""
    from moelab.backends import registry

    named = {b: r.family for r in load_rows() for b in r.backends}
    assert {"deepep", "deepep-ll", "hybrid-ep", "uccl-ep"} <= set(named)
    for backend, family in named.items():
        cls = registry.load(backend)
        assert cls.dispatch_family == family, backend
    for name in registry.BUILTIN:
        cls = registry.load(name)
        assert cls.dispatch_family and cls.dispatch_family_source, name
    assert registry.load("nccl-ep").dispatch_family == "hierarchical"
