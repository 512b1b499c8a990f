"""Communication under GEMMs, from a Chrome trace: interval arithmetic and the per-range table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.tracing.overlap import intersection, kernel_overlap, length, union


def _x(name: str, ts: float, dur: float, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 0, "tid": 7}


def _trace(tmp_path: Path) -> Path:
    events = [
        _x("moelab/deepep/layer/case", 0, 100, "user_annotation"),
        _x("void deep_ep::intranode::dispatch<8>(...)", 0, 10),
        _x("sm90_xmma_gemm_bf16bf16_bf16f32", 5, 15),  # 5 µs under the dispatch
        _x("void deep_ep::intranode::combine<...>", 30, 10),
        _x("cutlass::Kernel2<grouped>", 35, 20),  # 5 more
        _x("elementwise_kernel", 0, 100),  # neither class
        _x("moelab/deepep/layer_serial/case", 200, 100, "user_annotation"),
        _x("ncclDevKernel_SendRecv", 200, 10),
        _x("sm90_xmma_gemm_bf16bf16_bf16f32", 210, 30),
        _x("ncclDevKernel_SendRecv", 400, 10),  # outside every range
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_overlap_per_range(tmp_path: Path) -> None:
    rows = {r.op: r for r in kernel_overlap(_trace(tmp_path))}
    layer, serial = rows["layer"], rows["layer_serial"]
    assert (layer.comm_us, layer.gemm_us, layer.overlap_us) == (20, 35, 10)
    assert layer.hidden_fraction == pytest.approx(0.5)
    assert (serial.comm_us, serial.overlap_us, serial.hidden_fraction) == (10, 0, 0)


def test_cli_prints_the_hidden_share(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["trace", "overlap", str(_trace(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "50%" in result.stdout and "layer_serial" in result.stdout
    missing = CliRunner().invoke(app, ["trace", "overlap", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and missing.stderr.startswith("error:")


spans = st.lists(
    st.tuples(st.integers(0, 100), st.integers(1, 20)).map(lambda t: (t[0], t[0] + t[1])), max_size=8
)


@given(spans, spans)
def test_intersection_is_bounded_and_symmetric(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    ua, ub = union([(float(s), float(e)) for s, e in a]), union([(float(s), float(e)) for s, e in b])
    both = length(intersection(ua, ub))
    assert both == length(intersection(ub, ua))
    assert 0 <= both <= min(length(ua), length(ub))
    assert length(intersection(ua, ua)) == length(ua)
