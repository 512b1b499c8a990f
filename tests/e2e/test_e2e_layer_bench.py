"""benchmarks/e2e_layer_gpu.py, the GPU benchmark of issue 27, runs on the CPU at tiny shapes: every preset
checked against the float32 reference, every piece and schedule timed, the variants side by side, the
roofline left empty (no GPU rates are ever invented), the figures written to --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_benchmark_runs_on_cpu_at_tiny_shapes(tmp_path: Path) -> None:
    out = tmp_path / "e2e_layer.json"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/e2e_layer_gpu.py",
            "--tiny",
            "--shapes",
            "reference,mixtral-8x7b",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "un-permute variants" in done.stdout and "per shape at EP = 1" in done.stdout
    data = json.loads(out.read_text())
    assert data["rates"] is None and [s["name"] for s in data["shapes"]] == ["reference", "mixtral-8x7b"]
    for shape in data["shapes"]:
        assert shape["check"]["layer_err"] < shape["check"]["tolerance"] and not shape["check"]["messages"]
        assert shape["check"]["grad_x_err"] < 2 * shape["check"]["tolerance"]
        for op in (
            "gemm_only",
            "gemm_fwd_bwd",
            "layer_tbo",
            "layer_tbo_fwd_bwd",
            "compute_only_split",
            "unpermute:index_add",
            "unpermute:torch",
            "layer_serial_fwd_bwd:torch",
            "dispatch",
        ):
            assert shape["us"][op] > 0, op
        d = shape["derived"]
        assert d["permute_impl"] == "torch" and d["tbo_over_serial"] > 0 and "roofline_share_serial" not in d
        assert shape["source"].startswith(("https://huggingface.co/", "moelab's reference"))
