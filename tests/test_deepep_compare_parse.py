"""benchmarks/deepep_compare.py on recorded text written from the print formats of DeepEP v1.2.1
tests/test_intranode.py and Hybrid-EP (branch hybrid-ep, 94a9f8f) tests/test_hybrid_ep.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "deepep_compare.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deepep_compare", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deepep_compare"] = module
    spec.loader.exec_module(module)
    return module


dc = _load()

DEEPEP_LOG = """\
[config] num_tokens=4096, hidden=7168, num_topk=8
[layout] Kernel performance: 0.042 ms

[testing] Running with BF16, without top-k (async=False, previous=False) ... passed
[testing] Running with FP8, with top-k (async=True, previous=True) ... passed

[tuning] SMs 24, NVL chunk 4: 180.11 GB/s (NVL), avg_t: 339.52 us
[tuning] SMs 24, NVL chunk 6: 229.87 GB/s (NVL), avg_t: 266.02 us
[tuning] SMs 24, NVL chunk 8: 235.40 GB/s (NVL), avg_t: 259.77 us
[tuning] SMs 24, NVL chunk default: 232.02 GB/s (NVL), avg_t: 263.55 us
[tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, 235.40 GB/s (NVL), t: 259.77 us

[tuning] SMs 24, NVL chunk 4: 250.33 GB/s (NVL), avg_t: 469.01 us
[tuning] SMs 24, NVL chunk 20: 332.10 GB/s (NVL), avg_t: 353.52 us
[tuning] SMs 24, NVL chunk default: 330.95 GB/s (NVL), avg_t: 354.75 us
[tuning] Best dispatch (BF16): SMs 24, NVL chunk 20, 332.10 GB/s (NVL), t: 353.52 us

[tuning] SMs 24, NVL chunk 1: 120.45 GB/s (NVL), avg_t: 974.77 us
[tuning] SMs 24, NVL chunk 7: 300.02 GB/s (NVL), avg_t: 391.33 us
[tuning] SMs 24, NVL chunk default: 297.61 GB/s (NVL), avg_t: 394.50 us
[tuning] Best combine: SMs 24, NVL chunk 7: 300.02 GB/s (NVL), t: 391.33 us

"""

HYBRID_LOG = """\

=== Correctness Check (BF16, 2 ranks) ===
  dispatch+combine API: PASS
  dispatch_with_permute + combine_with_unpermute API (non-fused): PASS

=== Torch API Benchmark (BF16, 2 ranks) ===
  Non-permute:  dispatch = dispatch_kernel + d2d + misc
  (misc = device_sync, update_flag, etc.)
dispatch (BF16):                                 366.12 GB/s (NVL), t: 374.6 us [min=371.0, max=378.2], nvl_recv_bytes: 137.15 MB
combine:                                         461.30 GB/s (NVL), t: 297.3 us [min=296.1, max=298.5], combine_send_bytes: 137.15 MB
dispatch+permute (BF16):                         350.00 GB/s (NVL), t: 391.9 us [min=390.0, max=393.8], nvl_recv_bytes: 137.15 MB
combine+unpermute:                               300.10 GB/s (NVL), t: 457.0 us [min=455.2, max=458.8], combine_send_bytes: 137.15 MB
fused dispatch+permute (BF16):                   370.40 GB/s (NVL), t: 370.3 us [min=368.9, max=371.7], nvl_recv_bytes: 137.15 MB
fused combine+unpermute:                         321.00 GB/s (NVL), t: 427.3 us [min=425.0, max=429.6], combine_send_bytes: 137.15 MB

=== Kernel Benchmark (BF16, 2 ranks) ===
  Non-fused:  dispatch_kernel only  |  combine_kernel only
dispatch kernel (BF16)(NVL):                     584.20 GB/s, avg_t=234.8 us [min=233.1, max=236.5]
combine kernel(NVL):                             649.00 GB/s, avg_t=211.3 us [min=210.0, max=212.6]
fused dispatch+permute kernel (BF16)(NVL):       560.00 GB/s, avg_t=244.9 us [min=243.0, max=246.8]
fused combine+unpermute kernel(NVL):             600.00 GB/s, avg_t=228.6 us [min=227.0, max=230.2]

=== Correctness Check (FP8, 2 ranks) ===
  dispatch+combine API: PASS

=== Torch API Benchmark (FP8, 2 ranks) ===
dispatch (FP8):                                  294.05 GB/s (NVL), t: 240.4 us [min=238.0, max=242.8], nvl_recv_bytes: 70.70 MB
combine:                                         455.00 GB/s (NVL), t: 301.4 us [min=300.0, max=302.8], combine_send_bytes: 137.15 MB

=== Kernel Benchmark (FP8, 2 ranks) ===
dispatch kernel (FP8)(NVL):                      569.00 GB/s, avg_t=124.3 us [min=123.0, max=125.6]
combine kernel(NVL):                             640.00 GB/s, avg_t=214.3 us [min=213.0, max=215.6]
"""


def test_deepep_best_figures() -> None:
    figures = dc.parse_deepep(DEEPEP_LOG)
    assert len(figures) == 13  # 10 tuning lines + 3 Best lines
    chosen = dc.best(figures)
    bf16 = chosen["dispatch|BF16|api|NVL"]
    assert (
        bf16.best
        and bf16.gbps == 332.10
        and bf16.sms == 24
        and bf16.nvl_chunk == "20"
        and bf16.time_us == 353.52
    )
    assert chosen["dispatch|FP8|api|NVL"].gbps == 235.40
    assert chosen["combine|BF16|api|NVL"].gbps == 300.02 and chosen["combine|BF16|api|NVL"].nvl_chunk == "7"
    defaults = [f for f in figures if f.nvl_chunk == "default"]
    assert [(f.op, f.dtype) for f in defaults] == [
        ("dispatch", "FP8"),
        ("dispatch", "BF16"),
        ("combine", "BF16"),
    ]
    assert dc.deepep_config(DEEPEP_LOG) == {"num_tokens": 4096, "hidden": 7168, "num_topk": 8}


def test_deepep_without_fp8_starts_with_bf16() -> None:
    text = "\n".join(
        line
        for line in DEEPEP_LOG.splitlines()
        if "FP8" not in line
        and "180.11" not in line
        and "229.87" not in line
        and "235.40" not in line
        and "232.02" not in line
    )
    figures = dc.parse_deepep(text)
    assert {f.dtype for f in figures if f.op == "dispatch"} == {"BF16"}


def test_hybrid_ep_figures() -> None:
    chosen = dc.best(dc.parse_hybrid_ep(HYBRID_LOG))
    d = chosen["dispatch|BF16|api|NVL"]
    assert d.gbps == 366.12 and d.time_us == 374.6 and d.mbytes == 137.15
    assert chosen["combine|BF16|api|NVL"].gbps == 461.30
    assert chosen["fused dispatch+permute|BF16|api|NVL"].gbps == 370.40
    assert chosen["fused combine+unpermute|BF16|api|NVL"].gbps == 321.00
    assert chosen["dispatch kernel|BF16|kernel|NVL"].gbps == 584.20
    assert chosen["combine kernel|BF16|kernel|NVL"].gbps == 649.00
    assert chosen["dispatch|FP8|api|NVL"].gbps == 294.05
    assert chosen["dispatch kernel|FP8|kernel|NVL"].gbps == 569.00
    assert chosen["combine|FP8|api|NVL"].gbps == 455.00  # combine measured in the FP8 run (bf16 payload)
    assert len(chosen) == 14


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "h.log"
    log.write_text(HYBRID_LOG)
    assert dc.main(["hybrid-ep", str(log)]) == 0
    assert "366.12" in capsys.readouterr().out
    empty = tmp_path / "e.log"
    empty.write_text("nothing here\n")
    assert dc.main(["deepep", str(empty), "--json"]) == 1
