"""The overlapped schedules of the e2e layer: their settings, what each needs from a backend (refused before
any kernel runs, with the reason), the expert groups, and a real `moelab run` of each on gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from moelab.backends.deepep import DeepEPBackend
from moelab.backends.deepep_ll import DeepEPLowLatencyBackend
from moelab.backends.hybrid_ep import HybridEPBackend
from moelab.backends.mxfp8_a2a import Mxfp8A2ABackend
from moelab.backends.nccl_a2a import NcclA2ABackend
from moelab.cli.main import app
from moelab.core.e2e_spec import E2ESpec
from moelab.core.errors import SpecError
from moelab.core.workload import Workload
from moelab.measure.e2e.schedules import (
    expert_group_bounds,
    expert_group_routing,
    schedule_reason,
    sms_taken_from_gemms,
)

WL = Workload(hidden=64, tokens_per_rank=32, topk=4, experts_per_rank=6)


def _resolve(sms: int | None = None, **knobs: Any) -> Any:
    return E2ESpec.from_knobs(knobs).resolve(WL, sms)


def test_schedule_names_and_defaults() -> None:
    assert _resolve().schedule == "serial"
    assert _resolve(mode="tbo").schedule == "tbo"
    assert _resolve(mode="expert").schedule == "expert/4"
    assert _resolve(mode="expert", chunks=16).chunks == 6  # a group holds at least one expert
    assert _resolve(16, mode="tbo", comm="partition").schedule == "tbo+partition"
    assert _resolve(mode="chunked", chunks=3, comm="hook").schedule == "chunked/3+hook"
    record = _resolve(mode="expert", chunks=2, comm="zero-sm").to_record("loop")
    assert record["schedule"] == "expert/2+zero-sm" and record["comm"] == "zero-sm"
    assert _resolve(mode="columns", chunks=2, comm="priority").schedule == "columns/2+priority"


@pytest.mark.parametrize(
    ("sms", "knobs", "message"),
    [
        (None, {"comm": "hook"}, "comm = hook needs an overlapped mode"),
        (None, {"mode": "tbo", "comm": "partition"}, "comm = partition needs sms = N"),
        (None, {"mode": "tbo", "comm": "nvlink"}, "e2e knob comm must be one of shared, priority, partition"),
        (None, {"mode": "tbo", "chunks": 3}, "needs mode = chunked, expert or columns"),
        (None, {"mode": "pipelined"}, "e2e knob mode must be one of serial, tbo, chunked, expert"),
    ],
)
def test_bad_schedule_settings_are_refused(sms: int | None, knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _resolve(sms, **knobs)


PRIORITY_SUITE = """
name = "priority"
description = "the communication stream at the highest priority"

[workload]
hidden = 64
tokens_per_rank = 24
topk = 4
experts_per_rank = 4
dtype = "bf16"

[backend.nccl-a2a.axes]
bench = ["e2e"]
mode = ["tbo", "columns"]
comm = ["priority"]
backward = [true]
intermediate = [16]
"""


@pytest.mark.slow  # real gloo ranks
def test_moelab_run_runs_comm_priority_and_says_so(tmp_path: Path, db_path: Path) -> None:
    """`comm = priority` through `moelab run`: a stream property any backend can run in the micro-batch
    modes, checked forward and backward like shared; the record names it and says off CUDA there are no
    streams. Beside mode columns (which hung DeepEP V1 on GPUs) it is stored unsupported, with the reason,
    having run nothing."""
    suite = tmp_path / "priority.toml"
    suite.write_text(PRIORITY_SUITE)
    args = ["run", "--cpu", "--suite", str(suite), "--iters", "2", "--warmup", "0", "--no-health", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--run-id", "prio", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db_path), read_only=True) as con:
        rows = con.execute(
            "SELECT case_id, status, reason, backend_record FROM cases WHERE run_id = 'prio'"
        ).fetchall()
        errs = con.execute(
            "SELECT value FROM case_metrics WHERE run_id = 'prio' AND name IN ('layer_rel_err', 'grad_x_rel_err')"
        ).fetchall()
        columns_rows = con.execute(
            "SELECT count(*) FROM results WHERE run_id = 'prio' AND case_id LIKE '%mode=columns%'"
        ).fetchone()
    status = {("mode=columns" in c, s): (why, r) for c, s, why, r in rows}
    assert set(status) == {(False, "ok"), (True, "unsupported")}, rows
    tbo = json.loads(status[(False, "ok")][1])["e2e"]
    assert tbo["schedule"] == "tbo+priority" and "no streams off CUDA" in tbo["gemm_sms"]
    assert len(errs) == 2 and all(v < 0.05 for (v,) in errs)
    reason = status[(True, "unsupported")][0] or ""
    assert "comm = priority runs micro-batches" in reason and columns_rows == (0,)


@pytest.mark.gpu
def test_comm_priority_puts_the_communication_stream_above_the_compute_stream() -> None:
    from moelab.measure.e2e.overlap import Streams

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda", 0)
    plain, high = Streams(device), Streams(device, priority=True)
    assert high.comm is not None and high.compute is not None
    assert plain.comm_priority == 0 and high.comm_priority < 0
    assert high.comm.priority < high.compute.priority


def test_sms_the_schedule_takes_from_the_gemms() -> None:
    """The partition's are the communication's; a schedule whose communication holds no SM takes none
    (no carve-out by default); shared SMs at the library's default are not a fixed number."""
    assert _resolve(mode="tbo").carveout == 0 and sms_taken_from_gemms(_resolve(mode="tbo"), None) is None
    assert sms_taken_from_gemms(_resolve(24, mode="tbo"), 24) == 24  # carveout auto = the comm's SMs
    assert sms_taken_from_gemms(_resolve(24, mode="tbo", comm="partition"), 24) == 24
    zero = _resolve(24, mode="tbo", comm="zero-sm")
    assert zero.carveout == 0 and sms_taken_from_gemms(zero, 24) == 0
    assert sms_taken_from_gemms(_resolve(), None) == 0


@pytest.mark.parametrize(
    ("cls", "knobs", "comm_backend", "reason"),
    [
        (NcclA2ABackend, {"mode": "expert"}, "gloo", None),
        (Mxfp8A2ABackend, {"mode": "expert"}, "nccl", None),
        (DeepEPBackend, {"mode": "expert"}, "nccl", None),
        (HybridEPBackend, {"mode": "expert"}, "nccl", "needs a dispatch that takes masked routing"),
        (DeepEPLowLatencyBackend, {"mode": "expert"}, "nccl", "needs a dispatch that takes masked routing"),
        (NcclA2ABackend, {"mode": "tbo", "comm": "hook"}, "nccl", "capability RecvHook); nccl-a2a has none"),
        (DeepEPLowLatencyBackend, {"mode": "tbo", "comm": "hook"}, "nccl", None),
        (DeepEPBackend, {"mode": "tbo", "comm": "zero-sm"}, "nccl", "capability ZeroSmComm; deepep has none"),
        (NcclA2ABackend, {"mode": "tbo", "comm": "zero-sm"}, "gloo", "needs NCCL's zero-CTA policy; gloo"),
        (
            DeepEPLowLatencyBackend,
            {"mode": "tbo", "comm": "partition"},
            "nccl",
            "deepep-ll has no SM control",
        ),
        (DeepEPBackend, {"mode": "tbo", "comm": "partition"}, "nccl", None),
        (DeepEPBackend, {"mode": "tbo", "comm": "priority"}, "nccl", None),
        (HybridEPBackend, {"mode": "chunked", "comm": "priority"}, "nccl", None),
        (NcclA2ABackend, {"mode": "expert", "comm": "priority"}, "gloo", None),
        (
            DeepEPBackend,
            {"mode": "columns", "comm": "priority"},
            "nccl",
            "comm = priority runs micro-batches",
        ),
        (
            NcclA2ABackend,
            {"mode": "columns", "comm": "priority"},
            "nccl",
            "hung a backend's kernels in backward",
        ),
    ],
)
def test_what_each_schedule_needs_from_a_backend(
    cls: type, knobs: dict[str, Any], comm_backend: str, reason: str | None
) -> None:
    got = schedule_reason(cls, _resolve(16, **knobs), comm_backend)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_zero_sm_on_this_torch_says_why_not_or_runs() -> None:
    """Over NCCL the reason names what this torch or NCCL lacks; a CPU torch has no NCCL at all."""
    got = schedule_reason(NcclA2ABackend, _resolve(mode="tbo", comm="zero-sm"), "nccl")
    if not hasattr(torch.distributed, "ProcessGroupNCCL"):
        assert got is not None and "built without NCCL" in got


def test_auto_candidates_are_what_the_backend_can_run() -> None:
    from moelab.measure.e2e.auto_schedule import candidates

    def names(cls: type, comm: str = "shared") -> list[str]:
        return [c.schedule for c in candidates(_resolve(16, mode="auto", comm=comm), cls, "nccl", 6)]  # type: ignore[arg-type]

    assert names(NcclA2ABackend) == [
        "auto:serial",
        "auto:tbo",
        "auto:expert/2",
        "auto:expert/4",
        "auto:columns/4",
    ]
    assert names(HybridEPBackend) == ["auto:serial", "auto:tbo"]  # no masked routing: no expert groups
    assert names(DeepEPLowLatencyBackend, "hook") == ["auto:serial", "auto:tbo+hook"]
    assert all(c.carveout == 0 for c in candidates(_resolve(16, mode="auto"), NcclA2ABackend, "nccl", 6)[:1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("times", "chosen"),
    [
        ([(100.0, 300.0), (90.0, 310.0), (95.0, 290.0)], 2),  # tbo wins forward but loses fwd+bwd: expert
        ([(100.0, 300.0), (101.0, 320.0), (120.0, 299.0)], 0),  # nothing pays both ways: serial
        ([(100.0, None), (80.0, None)], 1),  # forward only
        ([(100.0, 300.0), (100.0, 300.0)], 0),  # a tie keeps serial
        ([(100.0, 300.0), (99.5, 298.0)], 0),  # within MARGIN of serial: noise, serial kept
        ([(100.0, 300.0), (98.5, 296.0), (99.5, 290.0)], 1),  # past MARGIN both ways
    ],
)
def test_auto_picks_the_best_worse_speedup(times: list[tuple[float, float | None]], chosen: int) -> None:
    from moelab.measure.e2e.auto_schedule import pick

    assert pick(times) == chosen


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 12),
    topk=st.integers(1, 4),
    ranks=st.integers(1, 3),
    per_rank=st.integers(1, 7),
    groups=st.integers(1, 9),
    seed=st.integers(0, 1000),
)
def test_every_pair_lands_in_exactly_one_expert_group(
    tokens: int, topk: int, ranks: int, per_rank: int, groups: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, ranks * per_rank, (tokens, topk), generator=g)
    idx[torch.rand(tokens, topk, generator=g) < 0.2] = -1  # already masked slots stay masked
    w = torch.rand(tokens, topk, generator=g, dtype=torch.float32)
    parts = expert_group_routing(idx, w, per_rank, groups)
    assert len(parts) == len(expert_group_bounds(per_rank, groups)) == min(groups, per_rank)
    kept = torch.stack([p[0] >= 0 for p in parts]).sum(0)
    assert torch.equal(kept, (idx >= 0).long())
    assert torch.equal(sum(p[1] for p in parts), torch.where(idx >= 0, w, 0.0))
    for (lo, hi), (pidx, _) in zip(expert_group_bounds(per_rank, groups), parts, strict=True):
        local = pidx[pidx >= 0] % per_rank
        assert bool(((local >= lo) & (local < hi)).all())


SUITE = """
name = "schedules"
description = "every overlapped schedule beside serial"

[workload]
hidden = 64
tokens_per_rank = 24
topk = 4
experts_per_rank = 4
routing = "zipf"
dtype = "bf16"

[backend.nccl-a2a.axes]
bench = ["e2e"]
mode = ["serial", "tbo", "expert", "columns", "auto"]
comm = ["shared", "hook", "zero-sm"]
backward = [true]
intermediate = [16]
"""


def _suite(tmp_path: Path) -> str:
    path = tmp_path / "schedules.toml"
    path.write_text(SUITE)
    return str(path)


def test_list_cases_marks_schedules_the_backend_cannot_run(tmp_path: Path) -> None:
    """Before any rank starts: `--list-cases` says which schedules nccl-a2a on gloo cannot run and why."""
    result = CliRunner().invoke(app, ["run", "--cpu", "--list-cases", "--suite", _suite(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "15 cases (5 to run, 10 not)" in out
    assert "capability RecvHook); nccl-a2a has none" in out
    assert "needs NCCL's zero-CTA policy; gloo has none" in out


@pytest.mark.slow  # real gloo ranks
def test_moelab_run_measures_every_schedule_and_refuses_what_it_cannot(tmp_path: Path, db_path: Path) -> None:
    """`moelab run` on gloo: serial, tbo and expert-chunked run, are checked forward and backward against the
    reference, and store their schedule, the SMs taken from the GEMMs and their speedup over serial; the
    hook and zero-SM schedules are stored unsupported with the reason, having run nothing."""
    args = ["run", "--cpu", "--suite", _suite(tmp_path), "--iters", "2", "--warmup", "0", "--no-health"]
    result = CliRunner().invoke(app, [*args, "--quiet", "--run-id", "sched", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db_path), read_only=True) as con:
        rows = con.execute("SELECT case_id, status, reason FROM cases WHERE run_id = 'sched'").fetchall()
        records = dict(
            con.execute("SELECT case_id, backend_record FROM cases WHERE run_id = 'sched'").fetchall()
        )
        metrics = con.execute(
            "SELECT case_id, name, value FROM case_metrics WHERE run_id = 'sched' AND name IN "
            "('speedup_vs_serial', 'speedup_vs_serial_fwd_bwd', 'grad_x_rel_err', 'grad_w_rel_err', "
            "'layer_rel_err', 'sms_taken_from_gemms')"
        ).fetchall()
    status = {c: (s, r) for c, s, r in rows}
    ok = {c for c, (s, _) in status.items() if s == "ok"}
    # serial, tbo, expert, columns, auto (shared)
    assert len(ok) == 5 and any("mode=expert" in c for c in ok) and any("mode=columns" in c for c in ok), (
        status
    )
    refused = {c: r for c, (s, r) in status.items() if s == "unsupported"}
    assert len(refused) == 8 and all(("comm=hook" in c or "comm=zero-sm" in c) for c in refused), status
    assert all(
        ("RecvHook" in r) or ("zero-CTA" in r) or ("dispatches the batch whole" in r)
        for r in refused.values()
    )
    skipped = {c: r for c, (s, r) in status.items() if s == "skipped"}  # serial x comm: no schedule
    assert len(skipped) == 2 and all("needs an overlapped mode" in r for r in skipped.values()), status
    by = {(c, n): v for c, n, v in metrics}
    expert = next(c for c in ok if "mode=expert" in c)
    assert by[(expert, "speedup_vs_serial")] > 0 and by[(expert, "speedup_vs_serial_fwd_bwd")] > 0
    assert by[(expert, "grad_x_rel_err")] < 0.05 and by[(expert, "grad_w_rel_err")] < 0.05
    assert (expert, "sms_taken_from_gemms") in by
    # the column slices: checked forward and backward like the others, named in the record
    columns = next(c for c in ok if "mode=columns" in c)
    assert by[(columns, "speedup_vs_serial_fwd_bwd")] > 0 and by[(columns, "grad_w_rel_err")] < 0.05
    assert json.loads(records[columns])["e2e"]["schedule"] == "columns/4"
    # every overlapped case timed its serial baseline interleaved with itself, and says so
    overlapped = {c for c in ok if "mode=serial" not in c}
    assert all(json.loads(records[c])["e2e"]["serial_timing"] == "interleaved" for c in overlapped)
    assert json.loads(records[columns])["e2e"]["wgrad"].startswith("columns: W2 once")
    # auto timed serial, tbo and the expert groups on the case's rows and ran the best; serial compared too
    auto = next(c for c in ok if "mode=auto" in c)
    e2e = json.loads(records[auto])["e2e"]
    assert e2e["asked_mode"] == "auto" and e2e["schedule"].startswith("auto:")
    assert set(e2e["auto_trials_us"]) == {
        "auto:serial",
        "auto:tbo",
        "auto:expert/2",
        "auto:expert/4",
        "auto:columns/4",
    }
    assert by[(auto, "speedup_vs_serial")] > 0 and by[(auto, "grad_x_rel_err")] < 0.05
    # the report's layer section names each backend's fastest overlapped layer with its speedups and interval
    md = tmp_path / "report.md"
    shown = CliRunner().invoke(app, ["report", "--run", "sched", "--format", "md", "-o", str(md)])
    assert shown.exit_code == 0, shown.output
    text = md.read_text()
    assert "Fastest overlapped layer per backend" in text
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("Fastest overlapped layer per backend"))
    line = lines[at + 4]  # the sentence, a blank line, the header, its rule, then nccl-a2a's row
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[1] in ("tbo", "expert/4", "columns/4") or cells[1].startswith("auto:")
    assert cells[5].startswith("[") and cells[7].startswith("[")
    assert float(cells[8]) > 0 and cells[12] == "default"  # against the fastest serial layer, its SMs
    assert cells[9].startswith("[") and cells[11].startswith("[")  # with intervals from the stored iterations
    # tbo, expert/4, columns/4 and auto were compared; auto only where it chose a schedule that overlaps
    assert cells[14] == ("3" if e2e["schedule"] == "auto:serial" else "4")


@pytest.mark.slow  # real gloo ranks, several rounds
def test_moelab_tune_searches_the_schedules_asked(tmp_path: Path) -> None:
    """`moelab tune --schedules serial,expert`: every trial is one of those schedules, and the expert
    trials ran (ok) rather than being refused."""
    db = tmp_path / "t.duckdb"
    result = CliRunner().invoke(
        app,
        ["tune", "--cpu", "--backend", "nccl-a2a", "--hidden", "64", "--intermediate", "16",
         "--tokens-per-rank", "32", "--topk", "2", "--experts-per-rank", "4", "--iters", "3",
         "--schedules", "serial,expert", "--db", str(db), "--out", str(tmp_path / "runs")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        trials = con.execute("SELECT case_id, status FROM cases").fetchall()
    modes = {("mode=expert" in c, s) for c, s in trials}
    assert (True, "ok") in modes and (False, "ok") in modes
    assert not any("mode=tbo" in c for c, _ in trials)


@pytest.mark.parametrize("mode", ["tbo", "chunked", "expert", "auto"])
def test_a_backend_with_one_reused_receive_buffer_runs_serial_only(mode: str) -> None:
    """torch-symm-a2a's received rows are views of one symmetric buffer the next dispatch overwrites: its
    tbo layer read output error 1 on every rank of 4xH200 (serial correct). Every overlapped schedule is
    refused before any kernel runs; serial is not."""
    from moelab.backends.torch_symm_a2a import TorchSymmA2ABackend

    got = schedule_reason(TorchSymmA2ABackend, _resolve(mode=mode), "nccl")
    assert got is not None and "one receive buffer the next dispatch overwrites" in got
    assert schedule_reason(TorchSymmA2ABackend, _resolve(mode="serial"), "nccl") is None


@pytest.mark.slow  # real gloo ranks
@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_moelab_run_takes_the_wide_tile_grouped_gemm(tmp_path: Path, db_path: Path) -> None:
    """`gemm = "grouped-wide"` through `moelab run`: the tbo layer runs it, is checked forward and backward
    against the reference, and stores the implementation it ran."""
    suite = tmp_path / "wide.toml"
    suite.write_text(
        SUITE.replace(
            'mode = ["serial", "tbo", "expert", "columns", "auto"]', 'mode = ["tbo"]\ngemm = ["grouped-wide"]'
        ).replace('comm = ["shared", "hook", "zero-sm"]', 'comm = ["shared"]')
    )
    args = ["run", "--cpu", "--suite", str(suite), "--iters", "2", "--warmup", "0", "--no-health", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--run-id", "wide", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db_path), read_only=True) as con:
        (case_id, status, record), *more = con.execute(
            "SELECT case_id, status, backend_record FROM cases WHERE run_id = 'wide'"
        ).fetchall()
        errs = dict(
            con.execute(
                "SELECT name, value FROM case_metrics WHERE run_id = 'wide' AND name IN "
                "('layer_rel_err', 'grad_x_rel_err', 'grad_w_rel_err')"
            ).fetchall()
        )
    assert not more and status == "ok" and "gemm=grouped-wide" in case_id
    assert json.loads(record)["e2e"]["gemm"] == "grouped-wide"
    assert set(errs) == {"layer_rel_err", "grad_x_rel_err", "grad_w_rel_err"} and max(errs.values()) < 0.05


def _run_forward_only(tmp_path: Path, axes: str, run_id: str) -> None:
    """`moelab run --cpu` of SUITE with its mode line replaced by `axes`, comm shared, forward only."""
    suite = tmp_path / f"{run_id}.toml"
    suite.write_text(
        SUITE.replace('mode = ["serial", "tbo", "expert", "columns", "auto"]', axes)
        .replace('comm = ["shared", "hook", "zero-sm"]', 'comm = ["shared"]')
        .replace("backward = [true]", "backward = [false]")
    )
    args = ["run", "--cpu", "--suite", str(suite), "--iters", "2", "--warmup", "0", "--no-health", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--run-id", run_id, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output


@pytest.mark.slow  # real gloo ranks
def test_moelab_run_refuses_the_triton_gemm_off_cuda_and_runs_the_rest(tmp_path: Path, db_path: Path) -> None:
    """`gemm = "triton"` through `moelab run` on gloo: that case is stored `unsupported` with the reason
    before any kernel runs, the run goes on and its other case (grouped) is measured."""
    _run_forward_only(tmp_path, 'mode = ["serial"]\ngemm = ["triton", "grouped"]', "tri")
    with duckdb.connect(str(db_path), read_only=True) as con:
        rows = con.execute("SELECT case_id, status, reason FROM cases WHERE run_id = 'tri'").fetchall()
        timed = con.execute(
            "SELECT DISTINCT case_id FROM results WHERE run_id = 'tri' AND case_id LIKE '%gemm=triton%'"
        ).fetchall()
    status = {("triton" if "gemm=triton" in c else "grouped"): (s, r) for c, s, r in rows}
    assert status["triton"] == ("unsupported", "gemm = triton: the Triton grouped GEMM runs on CUDA only")
    assert status["grouped"][0] == "ok" and timed == []


@pytest.mark.slow  # real gloo ranks
def test_moelab_run_off_cuda_records_no_sms_taken_by_a_carve_out(tmp_path: Path, db_path: Path) -> None:
    """A carve-out holds SMs back only on CUDA: `moelab run --cpu` of tbo with carveout = 200 stores no SMs
    taken from the GEMMs (the GEMMs ran on the CPU as without it) and says so in the record. It stored 200."""
    _run_forward_only(tmp_path, 'mode = ["tbo"]\ncarveout = [200]', "carve")
    with duckdb.connect(str(db_path), read_only=True) as con:
        (case, status, record), *rest = con.execute(
            "SELECT case_id, status, backend_record FROM cases WHERE run_id = 'carve'"
        ).fetchall()
        taken = con.execute(
            "SELECT value FROM case_metrics WHERE run_id = 'carve' AND name = 'sms_taken_from_gemms'"
        ).fetchall()
    assert rest == [] and status == "ok" and "carveout=200" in case
    assert taken == [(None,)]
    e2e = json.loads(record)["e2e"]
    assert e2e["carveout"] == 200 and "not applied" in e2e["gemm_sms"]
