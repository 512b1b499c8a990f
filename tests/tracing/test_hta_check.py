"""benchmarks/hta_check.py on a real CPU trace from capture_torch_trace: HTA finds a profiler step per
profiled iteration. Skipped where HolisticTraceAnalysis is not installed (it is not a dependency)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moelab.job.rundir import JobFiles
from moelab.tracing.torch_trace import TracedOp, capture_torch_trace

ROOT = Path(__file__).resolve().parent.parent.parent


def test_hta_sees_profiler_steps(tmp_path: Path) -> None:
    pytest.importorskip("hta")
    a = torch.randn(16, 16)
    for rank in (0, 1):
        capture_torch_trace(
            [TracedOp(op="dispatch", fn=lambda: a @ a)], backend="b", case_id="c", iters=3,
            path=JobFiles.of_dir(tmp_path).torch_trace("c", rank), rank=rank, world_size=2, device=torch.device("cpu"),
        )  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "hta_check.py"), str(tmp_path / "traces" / "c"), "--cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "profiler steps seen by HTA: [0, 1, 2, 3]" in done.stdout  # 3 iterations and the trailing step
