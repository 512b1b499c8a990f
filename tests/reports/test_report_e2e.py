"""The report's MoE-layer section: tokens/s vs communication SMs, each line's best S, the winner."""

from __future__ import annotations

from typing import Any

import pytest

from moelab.reports.e2e_section import build
from moelab.reports.html import ReportData, render


def _row(backend: str, mode: str, sms: int | None, tps: float, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": "r1", "backend": backend, "case_id": f"{backend}-{mode}-{sms}", "sms": sms, "knobs": "{}",
        "hidden": 8192, "tokens_per_rank": 4096, "topk": 8, "experts_per_rank": 8, "world": 2, "dtype": "bf16",
        "backend_record": "{}", "mode": mode, "intermediate": 2048, "knob_text": extra.pop("knob_text", ""),
        "layer_us": 4096 / tps * 1e6, "tokens_per_s_per_rank": tps, "exposed_comm_us": 100.0,
        "overlap_efficiency": 0.5, "gemm_slowdown": 0.04, "speedup_vs_serial": None,
        "tokens_per_s_per_rank_fwd_bwd": None, "roofline_share": None, "compute_roofline_share": None, **extra,
    }  # fmt: skip


ROWS = [
    _row("deepep", "tbo", 16, 400e3),
    _row("deepep", "tbo", 24, 450e3, roofline_share=0.62, compute_roofline_share=0.81),
    _row("deepep", "tbo", 32, 430e3),
    _row("deepep", "serial", None, 380e3),
    _row("nccl-a2a", "tbo", 16, 360e3),
    _row("nccl-a2a", "tbo", 32, 420e3),
    _row("hybrid-ep", "tbo", None, 410e3),
]


def test_blocks_name_each_lines_best_sms_and_the_winner() -> None:
    (block,) = build(ROWS, draw=False)
    best = {b["series"]: b["sms"] for b in block["best"]}
    assert best == {
        "deepep tbo (bf16)": "24",
        "deepep serial (bf16)": "default",
        "nccl-a2a tbo (bf16)": "32",
        "hybrid-ep tbo (bf16)": "default",
    }
    assert block["winner"] | {} == {
        "backend": "deepep", "mode": "tbo", "sms": "24", "knobs": "", "tokens_per_s": 450e3
    }  # fmt: skip
    assert block["margin_other_backend"] == pytest.approx(450 / 420 - 1)
    assert block["other_backend"] == "nccl-a2a tbo (bf16) at 32 SMs"
    assert len(block["rows"]) == len(ROWS)


def test_one_chart_holds_every_backend_and_marks_the_best() -> None:
    (block,) = build(ROWS, draw=True)
    svg = block["svg"]
    assert svg.startswith("<svg") and "deepep tbo (bf16)" in svg and "nccl-a2a tbo (bf16)" in svg
    assert "best 24" in svg and "best 32" in svg
    assert "hybrid-ep" not in svg  # only its library default was measured: no SM axis point, table only


def test_rendered_report_says_who_wins() -> None:
    data = ReportData(runs=[], environment=[], results=[], not_measured=[], jobs=[], definitions=[])
    data.e2e = build(ROWS, draw=False)
    html = render(data, "html")
    assert (
        'id="e2e"' in html
        and "Winner: deepep tbo at 24 SMs" in html
        and "7.1% over the best other backend" in html
    )
    assert "<td>62%</td><td>81%</td>" in html and "% of roofline" in html  # where measured; — elsewhere
    md = render(data, "md")
    assert "**deepep tbo at 24 SMs wins" in md and "| 62% |" in md


def test_workloads_are_kept_apart() -> None:
    other = [_row("deepep", "tbo", 24, 1.0) | {"hidden": 4096}]
    assert len(build(ROWS + other, draw=False)) == 2
