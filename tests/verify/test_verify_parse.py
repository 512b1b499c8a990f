"""verify's parsers on recorded device logs (results/h200x2/logs, DeepEP v1.2.1 and Hybrid-EP 94a9f8f on
2xH200) and on text in the libraries' print formats (DeepEP tests/test_low_latency.py, alltoall_perf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moelab.backends import deepep_own_tests, hybrid_ep_own_test
from moelab.backends.nccl_tests_job import figures as nccl_figures

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "results" / "h200x2" / "logs"


def _by(figs: list, op: str, dtype: str) -> object:
    found = [f for f in figs if f.op == op and f.dtype == dtype]
    assert len(found) == 1, (op, dtype, found)
    return found[0]


def test_deepep_intranode_recorded_log_uses_default_chunk_lines() -> None:
    text = (LOGS / "deepep_intranode.log").read_text()
    figs = deepep_own_tests.intranode_figures(text)
    assert len(figs) == 3
    fp8, bf16, comb = (
        _by(figs, "dispatch", "fp8"),
        _by(figs, "dispatch", "bf16"),
        _by(figs, "combine", "bf16"),
    )
    # the `NVL chunk default` lines, not the Best lines (234.41, 332.48, 297.38)
    assert (fp8.gbps, fp8.time_us) == (234.11, 258.66)  # type: ignore[attr-defined]
    assert (bf16.gbps, bf16.time_us) == (332.16, 353.57)  # type: ignore[attr-defined]
    assert (comb.gbps, comb.time_us) == (282.51, 415.71)  # type: ignore[attr-defined]
    assert "NVL chunk default" in bf16.line  # type: ignore[attr-defined]


def test_deepep_intranode_all_tuning_lines_and_best() -> None:
    lines = deepep_own_tests.parse_intranode((LOGS / "deepep_intranode.log").read_text())
    assert (
        len(lines) == 16 + 1 + 16 + 1 + 17 + 1
    )  # FP8 and BF16: 15 chunks + default + Best; combine: 16 + default + Best
    best = [t for t in lines if t.best]
    assert [(t.op, t.dtype, t.nvl_chunk, t.gbps) for t in best] == [
        ("dispatch", "fp8", "24", 234.41), ("dispatch", "bf16", "24", 332.48), ("combine", "bf16", "8", 297.38),
    ]  # fmt: skip
    assert {t.sms for t in lines} == {deepep_own_tests.INTRANODE_SMS}


DEEPEP_BF16_ONLY = """\
[config] num_tokens=2048, hidden=4096, num_topk=8
[testing] Running with BF16, with top-k (async=False, previous=False) ... passed
[tuning] SMs 24, NVL chunk 4: 150.00 GB/s (NVL), avg_t: 300.00 us
[tuning] SMs 24, NVL chunk default: 241.10 GB/s (NVL), avg_t: 190.00 us
[tuning] Best dispatch (BF16): SMs 24, NVL chunk 4, 150.00 GB/s (NVL), t: 300.00 us
[tuning] SMs 24, NVL chunk 1: 100.00 GB/s (NVL), avg_t: 450.00 us
[tuning] SMs 24, NVL chunk default: 248.10 GB/s (NVL), avg_t: 185.00 us
[tuning] Best combine: SMs 24, NVL chunk 1: 100.00 GB/s (NVL), t: 450.00 us
"""


def test_deepep_without_fp8_starts_with_bf16() -> None:
    figs = deepep_own_tests.intranode_figures(DEEPEP_BF16_ONLY)
    assert [(f.op, f.dtype, f.gbps) for f in figs] == [
        ("dispatch", "bf16", 241.10),
        ("combine", "bf16", 248.10),
    ]


def test_deepep_cut_off_run_gives_what_it_printed() -> None:
    text = (LOGS / "deepep_intranode.log").read_text()
    cut = text[: text.index("[tuning] SMs 24, NVL chunk 10: 308.89")]  # died during BF16 tuning
    figs = deepep_own_tests.intranode_figures(cut)
    assert [(f.op, f.dtype) for f in figs] == [("dispatch", "fp8")]
    assert deepep_own_tests.intranode_figures("Traceback (most recent call last):\nAssertionError\n") == []


LOW_LATENCY = """\
Allocating buffer size: 2116.2912 MB ...
[rank 1] Dispatch + combine bandwidth: 120.55 GB/s, avg_t=172.01 us, min_t=170.00 us, max_t=175.10 us
[rank 0] Dispatch + combine bandwidth: 121.31 GB/s, avg_t=170.93 us, min_t=169.50 us, max_t=174.00 us
[rank 0] Dispatch bandwidth: 98.20 GB/s, avg_t=76.70 us | Combine bandwidth: 140.10 GB/s, avg_t=57.90 us
[rank 1] Dispatch bandwidth: 97.00 GB/s, avg_t=77.60 us | Combine bandwidth: 139.00 GB/s, avg_t=58.30 us
[rank 0] Dispatch send/recv time: 30.10 + 20.20 us | Combine send/recv time: 25.00 + 22.00 us
"""


def test_deepep_low_latency_rank0_figures() -> None:
    figs = deepep_own_tests.low_latency_figures(LOW_LATENCY)
    assert [(f.op, f.timing, f.gbps, f.time_us) for f in figs] == [
        ("pair", "api", 121.31, 170.93), ("dispatch", "kernel", 98.20, 76.70), ("combine", "kernel", 140.10, 57.90),
    ]  # fmt: skip
    assert [f.gbps for f in deepep_own_tests.low_latency_figures(LOW_LATENCY, rank=1)] == [
        120.55,
        97.00,
        139.00,
    ]


def test_hybrid_ep_recorded_log_cut_before_fp8() -> None:
    figs = hybrid_ep_own_test.figures((LOGS / "hybrid_own.log").read_text())
    assert [(f.op, f.dtype, f.gbps, f.time_us) for f in figs] == [
        ("dispatch", "bf16", 368.77, 364.0), ("combine", "bf16", 463.70, 289.5),
    ]  # fmt: skip


def test_hybrid_ep_recorded_log_both_payloads() -> None:
    text = (LOGS / "hybrid_own_call2.log").read_text()
    figs = hybrid_ep_own_test.figures(text)
    assert [(f.op, f.dtype, f.gbps) for f in figs] == [
        ("dispatch", "bf16", 370.63), ("combine", "bf16", 463.15), ("dispatch", "fp8", 310.62), ("combine", "fp8", 463.32),
    ]  # fmt: skip
    lines = hybrid_ep_own_test.parse(text)
    kernel = {(h.label, h.dtype): h.gbps for h in lines if h.timing == "kernel"}
    assert (
        kernel[("dispatch kernel", "bf16")] == 584.21
        and kernel[("fused combine+unpermute kernel", "bf16")] == 330.20
    )
    api = {(h.label, h.dtype): h for h in lines if h.timing == "api"}
    assert api[("fused dispatch+permute", "bf16")].gbps == 377.19 and api[("dispatch", "fp8")].mbytes == 69.21
    assert len(api) == 10  # 6 in the BF16 run, 4 printed before the FP8 run was cut off


@pytest.mark.parametrize("name", ["text_ok.txt", "text_truncated.txt", "text_nccl_failure.txt"])
def test_nccl_tests_figures(name: str) -> None:
    from moelab.backends.nccl_tests import parse_text

    text = (ROOT / "tests" / "fixtures" / "nccl_tests" / name).read_text()
    figs = nccl_figures(text, "bf16")
    rows = parse_text(text).rows
    assert len(figs) == 2 * len(rows)
    for row in rows:
        algbw = [f for f in figs if f.size_bytes == row.size_bytes and f.label.endswith("algbw")]
        assert [f.gbps for f in algbw] == [row.algbw_gbps_oop]
    if name == "text_ok.txt":
        assert (figs[0].label, figs[0].gbps, figs[1].gbps, figs[0].time_us) == (
            "33554432 B algbw",
            216.05,
            108.02,
            155.31,
        )
