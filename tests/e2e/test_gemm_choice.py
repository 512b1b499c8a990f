"""The padded batched-matmul expert GEMM against the per-expert loop (forward and gradients, empty experts
included), and the record of which implementation and kernels ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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
    with pytest.raises(
        SpecError, match="e2e knob gemm must be one of auto, grouped, grouped-wide, triton, padded, loop"
    ):
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
        [sys.executable, "benchmarks/grouped_gemm_gpu.py", "--tiny", "--backward", "--json", str(out)],
        cwd=root,
        env=os.environ | {"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads(out.read_text())
    rows = written["rows"]
    assert written["dense_tflops_sustained"] > 0
    variants = {r["variant"] for r in rows}
    assert variants == {"loop", "grouped", "triton", "padded", "fp8-grouped", "grouped+bwd"}
    assert all("WRONG" not in r["note"] for r in rows)
    # the Triton GEMM is said unavailable on the CPU, with why, not timed
    assert [(r["us"], r["note"]) for r in rows if r["variant"] == "triton"] == [
        (None, "the Triton grouped GEMM runs on CUDA only")
    ] * 2
    assert all(r["us"] is not None for r in rows if r["variant"] in ("loop", "padded"))
    # each timed twice: synced after every call, and queued (on the CPU both are wall time)
    assert all(
        r["gpu_us"] is not None and r["gpu_pct_dense"] is not None for r in rows if r["us"] is not None
    )
    assert "kernel / note" in done.stdout and "gpu us" in done.stdout
    # the acceptance's candidates also timed alternately with a dense matmul of their FLOPs
    timed = {r["variant"]: r["paired_pct_dense"] for r in rows if r["us"] is not None}
    assert all(timed[v] is not None and timed[v] > 0 for v in ("loop", "grouped", "padded"))
    assert all(timed[v] is None for v in timed if v not in ("loop", "grouped", "padded"))
    assert "(paired with dense): best bf16" not in done.stdout  # no acceptance lines for tiny shapes


@pytest.mark.slow
def test_grouped_gemm_benchmark_times_the_kernels_under_a_carve_out(tmp_path: Path) -> None:
    """--carveout 3: grouped@3 beside grouped (triton@3 unavailable on the CPU, as triton), checked against
    the loop like the others; a count that is not a whole number above 0 is one line and exit 2."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gg.json"

    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "benchmarks/grouped_gemm_gpu.py", "--tiny", *args],
            cwd=root, env=os.environ | {"PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=240,
        )  # fmt: skip

    done = bench("--carveout", "3", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    carved = [r for r in rows if r["variant"] == "grouped@3"]
    assert len(carved) == 2 and all(r["us"] is not None and r["note"] == "3 SMs held back" for r in carved)
    assert "triton@3" not in {r["variant"] for r in rows}  # no Triton on the CPU: nothing to hold back
    for bad in ("8,x", "0"):
        refused = bench("--carveout", bad)
        assert refused.returncode == 2 and "error: argument --carveout: SM counts must" in refused.stderr


def test_paired_pct_dense_reads_a_matmul_of_its_own_size_near_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense matmul paired with the one the FLOPs size: the same work, so near 1 (wall time on the CPU;
    a bound that a wrong size (8x the FLOPs) or swapped timings would break)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import torch
    from grouped_gemm_gpu import paired_pct_dense

    n = 256
    a = torch.randn(n, n).to(torch.bfloat16)
    b = torch.randn(n, n).to(torch.bfloat16)
    c = torch.empty_like(a)
    ratio = paired_pct_dense(lambda: torch.matmul(a, b, out=c), 2.0 * n**3, torch.device("cpu"))
    assert 0.5 < ratio < 2.0
    slower = paired_pct_dense(
        lambda: [torch.matmul(a, b, out=c) for _ in range(8)], 2.0 * n**3, torch.device("cpu")
    )
    assert slower < 0.3  # eight matmuls' time for one's FLOPs


# --- grouped-wide: torch._grouped_mm with tail rows that make it launch its wide tile (issue 37) ---


def test_wide_tile_pad_lifts_the_average_past_the_narrow_tile_and_no_further() -> None:
    from moelab.measure.e2e.layer import NARROW_TILE_MAX_ROWS, wide_tile_pad

    # the DeepSeek-V3 micro-batch at EP = 2: 16384 pairs over 128 experts, 128 on average
    assert wide_tile_pad(16384, 128) == 128
    assert (16384 + wide_tile_pad(16384, 128)) / 128 > NARROW_TILE_MAX_ROWS
    assert wide_tile_pad(32768, 128) == 0  # the whole batch: 256 on average, wide already
    assert wide_tile_pad(0, 128) == 0 and wide_tile_pad(100, 0) == 0
    # torch divides in integers: 16385 rows over 128 groups average 128, still the narrow tile (the
    # 2 x H100 run of round 8 recorded the ping-pong kernel for such a micro-batch before this was so)
    assert wide_tile_pad(128 * 128 + 1, 128) == 127
    for rows in (1, 127, 128 * 64, 128 * 128, 129 * 128 - 1):
        assert (rows + wide_tile_pad(rows, 128)) // 128 > NARROW_TILE_MAX_ROWS
    assert wide_tile_pad(129 * 128, 128) == 0


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 20), experts=st.integers(1, 6), topk=st.integers(1, 3), seed=st.integers(0, 99))
def test_grouped_wide_equals_grouped_forward_and_backward(
    rows: int, experts: int, topk: int, seed: int
) -> None:
    """The tail rows change which kernel runs, never a value: outputs and every gradient bit-identical
    (each row's dot products are the same; torch's CPU grouped matmul runs both)."""
    x, offsets, weights, _ = _case(rows, experts, topk, seed)
    outs, grads = [], []
    for impl in ("grouped", "grouped-wide"):
        xg = x.detach().requires_grad_(True)
        weights.zero_grad()
        y = swiglu_ffn(xg, offsets, weights, impl)
        assert y.shape == x.shape  # the pad rows are cut off
        y.float().sum().backward()
        assert xg.grad is not None and weights.w13.grad is not None and weights.w2.grad is not None
        outs.append(y)
        grads.append((xg.grad.clone(), weights.w13.grad.clone(), weights.w2.grad.clone()))
    assert torch.equal(outs[1], outs[0])
    for got, want in zip(grads[1], grads[0], strict=True):
        assert torch.equal(got, want)


def test_gemm_tile_reads_the_cutlass_schedule_off_the_kernel_name() -> None:
    from moelab.measure.e2e.gemm_choice import gemm_tile

    assert gemm_tile("_ZN7cutlass...KernelPtrArrayTmaWarpSpecializedPingpongE...") == "64x128x128 ping-pong"
    assert (
        gemm_tile("_ZN7cutlass...KernelPtrArrayTmaWarpSpecializedCooperativeE...") == "128x256x64 cooperative"
    )
    assert gemm_tile("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == ""
    assert gemm_tile("triton_grouped_gemm") == "Triton, tile tuned per shape (the record's gemm_triton_tiles)"


def test_auto_times_grouped_wide_only_where_a_batch_would_take_the_narrow_tile() -> None:
    from moelab.measure.e2e.gemm_choice import candidates

    def batch(pairs: int) -> Any:
        return SimpleNamespace(num_pairs=pairs)

    assert candidates([batch(32768)], 128) == ("grouped", "padded")
    assert candidates([batch(32768), batch(16384), batch(16384)], 128) == (
        "grouped",
        "grouped-wide",
        "padded",
    )
    # moelab's Triton GEMM where it can run (gemm_choice.triton_runs: CUDA, SM90+, TMA, aligned rows)
    assert candidates([batch(32768)], 128, triton=True) == ("grouped", "triton", "padded")


def test_gemm_knob_takes_grouped_wide() -> None:
    wl = Workload(hidden=64, tokens_per_rank=8)
    assert E2ESpec(gemm="grouped-wide").resolve(wl).gemm == "grouped-wide"
    if hasattr(torch, "_grouped_mm"):
        assert resolve_gemm("grouped-wide", torch.device("cpu"), 64, 16) == "grouped-wide"


def test_ranks_agree_on_the_slowest_rank_and_grouped_stands_in_for_an_unpadded_rank() -> None:
    from moelab.measure.e2e.gemm_choice import slowest_rank

    padded_rank = {"grouped": 10.0, "grouped-wide": 7.0, "padded": 9.0}
    wide_rank = {"grouped": 6.0, "padded": 8.0}  # averages more than 128 rows: grouped-wide is grouped there
    got = slowest_rank([padded_rank, wide_rank])
    assert got == {"grouped": 10.0, "grouped-wide": 7.0, "padded": 9.0}
    assert min(got, key=lambda k: got[k]) == "grouped-wide"
    assert slowest_rank([{"grouped": 1.0}, {"padded": 2.0}]) == {
        "grouped": float("inf"),
        "padded": float("inf"),
    }


@pytest.mark.slow
def test_triton_tile_sweep_runs_on_the_interpreter_and_refuses_a_bad_shape(tmp_path: Path) -> None:
    """benchmarks/triton_gemm_tiles.py --tiny: each GEMM timed tuned and under every tiny config, on triton's
    interpreter, each output agreeing with the tuned launch's, rows written to --json; a --shape that names no
    preset, or no EP, is one line and exit 2."""
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "tiles.json"

    def sweep(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "benchmarks/triton_gemm_tiles.py", *args],
            cwd=root, env=os.environ | {"PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=400,
        )  # fmt: skip

    done = sweep("--tiny", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert {(r["gemm"], r["config"]) for r in rows} == {
        (g, c) for g in ("fc1", "fc2") for c in ("tuned", "16x16x16 w1 s1 half", "32x16x16 w1 s1")
    }
    assert all(r["us"] is not None and r["note"] == "" for r in rows)
    assert "FFN tuned" in done.stdout and "FFN best" in done.stdout
    for bad in ("mixtral:2", "deepseek-v3", "deepseek-v3:0"):
        refused = sweep("--shape", bad)
        assert refused.returncode == 2 and "--shape" in refused.stderr and "Traceback" not in refused.stderr
