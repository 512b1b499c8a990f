"""The padded batched-matmul expert GEMM against the per-expert loop (forward and gradients, empty experts
included), and the record of which implementation and kernels ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.e2e_spec import E2ESpec
from moelab.core.errors import SpecError
from moelab.core.workload import Workload
from moelab.measure.e2e.gemm_choice import gemm_kernels
from moelab.measure.e2e.layer import ExpertWeights, padded_index, resolve_gemm, swiglu_ffn
from moelab.measure.e2e.permute import pair_map, permute


def _case(
    rows: int, experts: int, topk: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, ExpertWeights, int]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, experts, (rows, topk), generator=g)  # -1: an expert on another rank
    w = torch.rand(rows, topk, generator=g)
    m, offsets = pair_map(idx, w, experts)
    x = permute(torch.randn(rows, 16, generator=g).to(torch.bfloat16), m, "torch")
    w13 = (torch.randn(experts, 16, 2 * 8, generator=g) * 0.25).to(torch.bfloat16).requires_grad_(True)
    w2 = (torch.randn(experts, 8, 16, generator=g) * 0.35).to(torch.bfloat16).requires_grad_(True)
    return x, offsets, ExpertWeights(w13=w13, w2=w2, first_expert=0), m.max_group


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 20), experts=st.integers(1, 6), topk=st.integers(1, 3), seed=st.integers(0, 99))
def test_padded_equals_loop_forward_and_backward(rows: int, experts: int, topk: int, seed: int) -> None:
    x, offsets, weights, max_group = _case(rows, experts, topk, seed)
    counts = torch.diff(offsets.long(), prepend=torch.zeros(1, dtype=torch.long))
    assert max_group == (int(counts.max()) if experts else 0)  # read in the grouping's one host sync
    outs, grads = [], []
    for impl in ("loop", "padded"):
        xg = x.detach().float().requires_grad_(True)
        weights.zero_grad()
        y = swiglu_ffn(xg.to(torch.bfloat16), offsets, weights, impl, max_group=max_group)
        y.float().sum().backward()
        assert xg.grad is not None and weights.w13.grad is not None and weights.w2.grad is not None
        outs.append(y.float())
        grads.append((xg.grad.clone(), weights.w13.grad.float().clone(), weights.w2.grad.float().clone()))
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


def test_padded_index_places_each_expert_at_its_row_block() -> None:
    offsets = torch.tensor([2, 2, 5], dtype=torch.int32)  # expert 1 gets nothing
    assert padded_index(offsets, 5, 3).tolist() == [0, 1, 6, 7, 8]


def test_gemm_knob_takes_padded_and_refuses_the_unknown() -> None:
    wl = Workload(hidden=64, tokens_per_rank=8)
    assert E2ESpec(gemm="padded").resolve(wl).gemm == "padded"
    assert resolve_gemm("padded", torch.device("cpu"), 64, 16) == "padded"
    with pytest.raises(SpecError, match="e2e knob gemm must be one of auto, grouped, padded, loop"):
        E2ESpec(gemm="fp4")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_no_gpu_kernels_off_cuda() -> None:
    assert gemm_kernels(lambda: None) == []


@pytest.mark.slow
def test_grouped_gemm_benchmark_runs_on_cpu_at_tiny_shapes(tmp_path: Path) -> None:
    """benchmarks/grouped_gemm_gpu.py --tiny: every variant timed or said unavailable, each bf16 variant
    agreeing with the loop, rows written to --json."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gg.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/grouped_gemm_gpu.py", "--tiny", "--json", str(out)],
        cwd=root,
        env=os.environ | {"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    variants = {r["variant"] for r in rows}
    assert variants == {"loop", "grouped", "padded", "fp8-grouped"}
    assert all("WRONG" not in r["note"] for r in rows)
    assert all(r["us"] is not None for r in rows if r["variant"] in ("loop", "padded"))
    assert "kernel / note" in done.stdout
