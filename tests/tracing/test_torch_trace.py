"""torch.profiler capture and Chrome-trace summaries: real CPU captures (one process, and nccl-a2a on a
2-rank gloo group), and a hand-made GPU-shaped trace for kernel attribution by correlation id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from moelab.backends.base import CaseConfig
from moelab.backends.nccl_a2a import NcclA2ABackend
from moelab.core.errors import MoelabError
from moelab.core.routing import route_all
from moelab.core.workload import Workload
from moelab.job.rundir import JobFiles
from moelab.measure.reference import make_tokens
from moelab.tracing.kernel_time import kernel_bandwidth_gbs, op_kernel_times
from moelab.tracing.summary import union_us
from moelab.tracing.torch_trace import (
    TracedOp,
    capture_torch_trace,
    summarize_chrome_trace,
)
from tests.distributed_helpers import gloo_context, run_ranks

CPU = torch.device("cpu")


def test_single_process_capture_without_process_group(tmp_path: Path) -> None:
    """No process group: distributedInfo is added by moelab, with the rank it was given (HTA needs it)."""
    assert not dist.is_initialized()
    a = torch.randn(32, 32)
    path = JobFiles.of_dir(tmp_path / "b").torch_trace("case/1", rank=3)
    cap = capture_torch_trace(
        [
            TracedOp(op="dispatch", fn=lambda: a @ a),
            TracedOp(op="roundtrip", fn=lambda: (a @ a) @ a, calls=2),
        ],
        backend="b",
        case_id="case1",
        iters=4,
        path=path,
        rank=3,
        world_size=8,
        device=CPU,
    )
    assert path == tmp_path / "b" / "traces" / "case_1" / "rank3.json"
    assert cap.size_bytes == path.stat().st_size > 0
    data = json.loads(path.read_text())
    assert data["distributedInfo"] == {"rank": 3, "world_size": 8}
    summary = summarize_chrome_trace(path)
    assert (summary.rank, summary.world_size, summary.attribution) == (3, 8, "cpu-nesting")
    d = summary.get("moelab/b/dispatch/case1")
    assert d is not None and d.count == 4 and d.event_kind == "cpu_op"
    assert d.kernel_us_total is None  # no GPU: unknown, not zero
    assert "aten::mm" in {k.name for k in d.kernels} or "aten::matmul" in {k.name for k in d.kernels}
    assert abs(sum(k.share for k in d.kernels) - 1.0) < 1e-9
    times = op_kernel_times(summary, "b", "case1")
    assert times["roundtrip"].calls == 8  # 4 instances × 2 calls each, from the trace's own metadata
    assert times["dispatch"].calls == 4 and times["dispatch"].kernel_us is None
    assert times["dispatch"].to_record()["kernels"]
    steps = sorted(
        int(e["name"].removeprefix("ProfilerStep#"))
        for e in data["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    )
    # one step per profiled iteration (4 dispatch + 4 pair), plus the empty one the last step() opens
    assert steps[:8] == list(range(8)) and len(steps) in (8, 9)


def _traced_a2a_rank(rank: int, world: int, out_dir: str) -> dict[str, Any]:
    wl = Workload(hidden=128, tokens_per_rank=32, topk=2, experts_per_rank=2)
    ctx = gloo_context(rank, world)
    case = CaseConfig(case_id="tcase", workload=wl)
    backend = NcclA2ABackend(ctx, [case])
    backend.prepare(case)
    routing = route_all(wl, world)[rank]
    x = make_tokens(wl, rank)
    d = backend.dispatch(x, routing.topk_idx, routing.topk_weights)
    expert_out = torch.zeros(d.num_rows, wl.hidden, dtype=torch.bfloat16)
    ops = [
        TracedOp(op="dispatch", fn=lambda: backend.dispatch(x, routing.topk_idx, routing.topk_weights)),
        TracedOp(op="combine", fn=lambda: backend.combine(expert_out, d.handle)),
    ]
    cap = capture_torch_trace(
        ops, backend="nccl-a2a", case_id="tcase", iters=3, path=JobFiles.of_dir(Path(out_dir)).torch_trace("tcase", rank),
        rank=rank, world_size=world, device=CPU, group=dist.group.WORLD,
    )  # fmt: skip
    summary = summarize_chrome_trace(cap.path)
    return {"path": str(cap.path), "calls": cap.calls, "summary": summary.to_dict()}


@pytest.mark.slow
def test_nccl_a2a_on_gloo_two_ranks_per_rank_traces(tmp_path: Path) -> None:
    results = run_ranks(2, _traced_a2a_rank, str(tmp_path))
    case_dir = tmp_path / "traces" / "tcase"
    assert sorted(p.name for p in case_dir.iterdir()) == ["rank0.json", "rank1.json"]
    for rank, res in enumerate(results):
        data = json.loads(Path(res["path"]).read_text())
        # what HTA's trace_file.create_rank_to_trace_dict requires: an int rank, unique per file
        assert data["distributedInfo"]["rank"] == rank
        assert data["distributedInfo"]["world_size"] == 2
        s = res["summary"]
        assert s["rank"] == rank and s["format"] == "chrome"
        by_name = {r["name"]: r for r in s["ranges"]}
        for op in ("dispatch", "combine"):
            r = by_name[f"moelab/nccl-a2a/{op}/tcase"]
            assert r["count"] == 3 and r["event_kind"] == "cpu_op"
            names = {k["name"] for k in r["kernels"]}
            # the a2a region and its events: torch's c10d op and gloo's transfer on its worker thread
            assert any("alltoall" in n or "all_to_all" in n for n in names), names
        dispatch_events = {
            k["name"]: k["count"] for k in by_name["moelab/nccl-a2a/dispatch/tcase"]["kernels"]
        }
        # dispatch makes 3 all_to_all_single calls (counts, metadata, payload) per iteration
        assert dispatch_events.get("c10d::alltoall_base_") == 9


def _gpu_trace() -> dict[str, Any]:
    """A GPU-shaped Chrome trace as torch.profiler writes it: user_annotation ranges on the CPU thread,
    cuda_runtime launches with args.correlation, kernels on the GPU with the same correlation."""
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "moelab/b/dispatch/c", "pid": 1, "tid": 1, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "user_annotation", "name": "moelab/b/dispatch/c", "pid": 1, "tid": 1, "ts": 300.0, "dur": 50.0},
        {"ph": "X", "cat": "user_annotation", "name": "other", "pid": 1, "tid": 1, "ts": 500.0, "dur": 50.0},
        # instance 1: two launches; their kernels overlap on two streams (union 30, sum 40)
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 101.0, "dur": 2.0, "args": {"correlation": 11}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "pid": 1, "tid": 1, "ts": 104.0, "dur": 2.0, "args": {"correlation": 12}},
        {"ph": "X", "cat": "kernel", "name": "index_kernel", "pid": 0, "tid": 7, "ts": 200.0, "dur": 20.0, "args": {"correlation": 11}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllToAll", "pid": 0, "tid": 8, "ts": 210.0, "dur": 20.0, "args": {"correlation": 12}},
        # instance 2: one launch, runs long after the CPU range ended
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 301.0, "dur": 2.0, "args": {"correlation": 21}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllToAll", "pid": 0, "tid": 8, "ts": 400.0, "dur": 25.0, "args": {"correlation": 21}},
        # a launch on another thread during the range, and one outside any moelab range: not attributed
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 110.0, "dur": 2.0, "args": {"correlation": 31}},
        {"ph": "X", "cat": "kernel", "name": "stray_kernel", "pid": 0, "tid": 7, "ts": 120.0, "dur": 5.0, "args": {"correlation": 31}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 501.0, "dur": 2.0, "args": {"correlation": 41}},
        {"ph": "X", "cat": "kernel", "name": "other_kernel", "pid": 0, "tid": 7, "ts": 520.0, "dur": 5.0, "args": {"correlation": 41}},
    ]  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": ev}


def test_kernel_attribution_by_correlation(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_gpu_trace()))
    s = summarize_chrome_trace(path)
    assert (s.rank, s.attribution) == (1, "correlation")
    assert [r.name for r in s.ranges] == ["moelab/b/dispatch/c"]
    r = s.ranges[0]
    assert r.count == 2 and r.event_kind == "kernel"
    assert r.api_us_total == pytest.approx(100.0)
    assert r.kernel_us_total == pytest.approx(30.0 + 25.0)  # union per instance
    assert r.kernel_sum_us_total == pytest.approx(40.0 + 25.0)
    shares = {k.name: (k.count, k.total_us, k.share) for k in r.kernels}
    assert shares == {
        "ncclDevKernel_AllToAll": (2, pytest.approx(45.0), pytest.approx(45 / 65)),
        "index_kernel": (1, pytest.approx(20.0), pytest.approx(20 / 65)),
    }
    t = op_kernel_times(s, "b", "c", calls={"moelab/b/dispatch/c": 2})["dispatch"]
    assert t.kernel_us == pytest.approx(27.5) and t.api_us == pytest.approx(50.0)
    assert kernel_bandwidth_gbs(27.5e3, t.kernel_us) == pytest.approx(1.0)
    assert kernel_bandwidth_gbs(1.0, None) is None
    everything = summarize_chrome_trace(path, prefix="")
    other = everything.get("other")
    assert other is not None and [k.name for k in other.kernels] == ["other_kernel"]


def test_union_of_intervals() -> None:
    assert union_us([]) == 0.0
    assert union_us([(0, 10), (5, 15), (20, 25)]) == 20.0
    assert union_us([(5, 6), (0, 10)]) == 10.0


def test_unreadable_trace_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MoelabError, match="cannot read"):
        summarize_chrome_trace(bad)
    bad.write_text(json.dumps({"foo": 1}))
    with pytest.raises(MoelabError, match="not a Chrome trace"):
        summarize_chrome_trace(bad)
