"""A suite crossing `bench = ["a2a", "e2e"]` stores the standalone dispatch/combine and the MoE layer at one
workload. On the 4 x H200 acceptance store (results/gpu-acceptance/h200x4/export) the report's answer table
ranked `nccl-a2a backward=True bench=e2e mode=tbo` against plain `nccl-a2a` for "dispatch", and listed the
layer's inner ops (gemm_mb, compute_only_split, ...) as answers; `compare` headlined them the same way.
A dispatch inside a layer is never the rival of a standalone one: each command keeps them apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from tests.committed_stores import RESULTS, imported_store, markdown_rows

EXPORT = RESULTS / "gpu-acceptance" / "h200x4" / "export"
runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return imported_store(EXPORT, tmp_path_factory, "acc")


def _answer_rows(md: str) -> list[list[str]]:
    head = md.index("| op | payload | workload | answer |")
    table = md[head:].split("\n\n", 1)[0].splitlines()[2:]
    return markdown_rows(table)


def test_the_reports_answer_keeps_the_layer_apart(store: str, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = runner.invoke(app, ["report", "--run", "acc-bench,acc-bench-lib", "--format", "md", "-o", str(out),
                              "--db", store])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = _answer_rows(out.read_text())
    plain = [r for r in rows if not r[2].endswith("MoE layer")]
    layer = [r for r in rows if r[2].endswith("MoE layer")]
    assert plain and layer
    for op, _, _, answer, entries, *_ in plain:
        assert "bench=e2e" not in answer + entries, (op, answer)
    assert {r[0] for r in layer} == {"layer", "layer_fwd_bwd"}
    for *_, entries, _peak, _bound, _flagged in layer:
        assert all("bench=e2e" in e for e in re.findall(r"\*\*([^*]+)\*\*", entries)), entries


def test_compare_headlines_the_layer_apart(store: str) -> None:
    res = runner.invoke(app, ["compare", "--run", "acc-bench,acc-bench-lib", "--db", store])
    assert res.exit_code == 0, res.output
    heads = [line for line in res.output.splitlines() if re.match(r"^[a-z_]+( in the MoE layer)?: ", line)]
    plain = [h for h in heads if " in the MoE layer: " not in h]
    assert plain and any(h.startswith("layer in the MoE layer: ") for h in heads), heads
    assert all("bench=e2e" not in h for h in plain), plain
    assert all("bench=e2e" in h or "no winner" in h for h in heads if " in the MoE layer: " in h), heads
