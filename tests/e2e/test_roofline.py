"""The e2e layer's roofline (moelab.measure.e2e.roofline): its arithmetic, the metrics formed from the
run's measured GPU rates (RUN_DIR/rates.json) or None with the reason, through a real 2-rank gloo case;
the rates themselves are stored by ingest (tests/store/test_store.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from moelab.core.e2e_spec import E2ESpec
from moelab.core.peaks import MeasuredRate, write_rates
from moelab.core.routing import route_all
from moelab.core.workload import Workload
from moelab.job.rundir import JobFiles, RunDir
from moelab.measure.e2e.metrics import e2e_metrics
from moelab.measure.e2e.roofline import DeviceRates, LayerWork, rates_from, run_rates
from tests.distributed_helpers import run_ranks
from tests.e2e.test_e2e_gloo import _bench_rank, _case

RATES = DeviceRates(matmul_tflops=800.0, copy_gbps=3000.0)


def rates_file(run_dir: Path) -> None:
    matmul = MeasuredRate(name="dense_bf16_matmul", value=800.0, unit="TFLOP/s", work=1.0, definition="d")
    copy = MeasuredRate(name="hbm_copy", value=3000.0, unit="GB/s", work=2.0, definition="d")
    write_rates(run_dir / "rates.json", [matmul, copy])


def test_floors_of_the_reference_shape() -> None:
    """hidden 8192, 4096 tokens, topk 8, intermediate 2048 on one rank (every pair local)."""
    w = LayerWork(pairs=4096 * 8, rows=4096, hidden=8192, intermediate=2048)
    assert w.gemm_flops(False) == 6 * 32768 * 8192 * 2048 and w.gemm_flops(True) == 3 * w.gemm_flops(False)
    assert w.gemm_floor_us(RATES, False) == pytest.approx(w.gemm_flops(False) / 800e12 * 1e6)  # ~4.1 ms
    # permute: read 4096 rows, write 32768; un-permute: read 32768, write 4096 (bf16)
    assert w.permute_bytes(False) == 2 * 2 * (4096 + 32768) * 8192
    assert (
        w.activation_bytes(False) == 2 * 32768 * 3 * 2048 and w.activation_bytes(True) == 2 * 32768 * 8 * 2048
    )
    assert w.compute_floor_us(RATES, False) == pytest.approx(
        w.gemm_floor_us(RATES, False) + (w.permute_bytes(False) + w.activation_bytes(False)) / 3000e9 * 1e6
    )
    non_gemm_us = w.bytes_floor_us(w.non_gemm_bytes(False), RATES)
    assert non_gemm_us == pytest.approx(536.87, rel=1e-4)  # 1.61 GB at 3 TB/s


def _ops(**medians: float) -> dict[str, dict[str, Any]]:
    return {op: {"samples_us": [[m, m, m]], "bytes_per_row": 0} for op, m in medians.items()}


def test_roofline_metrics_from_rates_and_without() -> None:
    wl = Workload(hidden=8192, tokens_per_rank=4096)
    settings = E2ESpec(mode="tbo", intermediate=2048, backward=True).resolve(wl)
    ops = _ops(
        layer=8000.0,
        layer_serial=7900.0,
        compute_only=7000.0,
        compute_only_split=7200.0,
        gemm=5000.0,
        permute=2000.0,
        gemm_mb=2600.0,
        gemm_mb_under_comm=2600.0,
        dispatch=300.0,
        combine=200.0,
        layer_fwd_bwd=24000.0,
        layer_fwd_bwd_serial=23800.0,
    )
    got = {
        m["name"]: m for m in e2e_metrics(ops, settings, wl, [32768], {}, rows_per_rank=[4096], rates=RATES)
    }
    w = LayerWork(pairs=32768, rows=4096, hidden=8192, intermediate=2048)
    floor = w.compute_floor_us(RATES, False)
    assert got["compute_roofline_us"]["value"] == pytest.approx(floor)
    # compute_only holds the GEMMs, SwiGLU and the un-permute, not the grouping (it runs in dispatch)
    only_floor = (
        w.gemm_floor_us(RATES, False)
        + (w.activation_bytes(False) + w.permute_bytes(False) / 2) / 3000e9 * 1e6
    )
    assert got["compute_roofline_share"]["value"] == pytest.approx(only_floor / 7000.0)
    assert got["roofline_us"]["value"] == pytest.approx(floor + 500.0)
    assert got["roofline_share"]["value"] == pytest.approx((floor + 500.0) / 8000.0)
    assert got["roofline_share_fwd_bwd"]["value"] == pytest.approx(
        (w.compute_floor_us(RATES, True) + 1000.0) / 24000.0
    )
    gemm_floor = w.gemm_floor_us(RATES, False) + w.activation_bytes(False) / 3000e9 * 1e6
    assert got["gemm_roofline_share"]["value"] == pytest.approx(gemm_floor / 5000.0)
    assert got["permute_over_floor"]["value"] == pytest.approx(
        2000.0 / (w.permute_bytes(False) / 3000e9 * 1e6)
    )
    assert got["dense_matmul_tflops"]["value"] == 800.0 and got["hbm_copy_gbps"]["value"] == 3000.0
    assert got["split_overhead_share"]["value"] == pytest.approx(200.0 / 7000.0)
    assert got["schedule_overhead_us"]["value"] == pytest.approx(100.0 - 200.0)
    none = {
        m["name"]: m
        for m in e2e_metrics(ops, settings, wl, [32768], {}, no_rates_reason="this run measured no GPU rates")
    }
    assert none.keys() == got.keys()
    for name in ("roofline_share", "compute_roofline_us", "dense_matmul_tflops", "roofline_share_fwd_bwd"):
        assert none[name]["value"] is None
        assert none[name]["definition"].endswith("; not formed: this run measured no GPU rates")
    assert none["split_overhead_share"]["value"] == got["split_overhead_share"]["value"]


def test_run_rates_reads_the_run_directory(tmp_path: Path) -> None:
    assert run_rates(None)[0] is None and run_rates(tmp_path) == (
        None,
        "this run measured no GPU rates (a CPU run, or peaks not measured)",
    )
    rates_file(tmp_path)
    assert run_rates(tmp_path) == (RATES, "")
    assert rates_from(RunDir(tmp_path).rates()[:1]) is None


def _bench_with_files(rank: int, world: int, run_dir: Path, cases: list[Any]) -> list[dict[str, Any]]:
    records = _bench_rank(rank, world, "nccl-a2a", cases, JobFiles(run_dir, "nccl-a2a"))
    return [r.to_dict() for r in records]


def _pairs_per_rank(wl: Workload, world: int) -> list[int]:
    """(token, expert) pairs each rank's experts receive, counted from every rank's routing."""
    idx = torch.cat([r.topk_idx for r in route_all(wl, world)])
    return [int((idx // wl.experts_per_rank == rank).sum()) for rank in range(world)]


@pytest.mark.slow
def test_a_real_case_forms_its_roofline_from_the_runs_rates(tmp_path: Path) -> None:
    rates_file(tmp_path)
    wl = Workload(hidden=64, tokens_per_rank=32, topk=4, experts_per_rank=3)
    case = _case("nccl-a2a", wl, mode="tbo", intermediate=16)
    rec = run_ranks(2, _bench_with_files, tmp_path, [case])[0][0]
    assert rec["status"] == "ok", rec.get("reason")
    m = {d["name"]: d["value"] for d in rec["metrics"]}
    rows = [r["recv_rows"] for r in rec["rows"]]
    works = [
        LayerWork(pairs=p, rows=r, hidden=64, intermediate=16)
        for p, r in zip(_pairs_per_rank(wl, 2), rows, strict=True)
    ]
    assert m["compute_roofline_us"] == pytest.approx(max(w.compute_floor_us(RATES, False) for w in works))
    assert m["roofline_us"] == pytest.approx(m["compute_roofline_us"] + m["comm_us"])
    assert 0 < m["roofline_share"] == pytest.approx(m["roofline_us"] / m["layer_us"])
    assert rec["backend_record"]["e2e"]["permute"] == "torch"


def test_a_ratio_outside_its_physical_range_is_no_figure() -> None:
    """permute_over_floor read 0.33-0.88 at EP = 2 (compute_only - gemm against the bytes of a grouping
    compute_only does not hold): the permute is timed directly now, and any ratio against a floor made of
    measured rates that lands on the wrong side of it is stored as None, the reading in its definition."""
    wl = Workload(hidden=8192, tokens_per_rank=4096)
    settings = E2ESpec(intermediate=2048).resolve(wl)
    w = LayerWork(pairs=32768, rows=4096, hidden=8192, intermediate=2048)
    permute_floor = w.bytes_floor_us(w.permute_bytes(False), RATES)
    gemm_floor = w.gemm_floor_us(RATES, False) + w.activation_bytes(False) / 3000e9 * 1e6

    def metrics(permute: float, gemm: float) -> dict[str, dict[str, Any]]:
        ops = _ops(
            layer=8000.0,
            dispatch=300.0,
            combine=200.0,
            gemm_mb=2600.0,
            gemm_mb_under_comm=2600.0,
            compute_only=7000.0,
            gemm=gemm,
            permute=permute,
        )
        got = e2e_metrics(ops, settings, wl, [32768], {}, rows_per_rank=[4096], rates=RATES)
        return {m["name"]: m for m in got}

    ok = metrics(permute=1.3 * permute_floor, gemm=1.2 * gemm_floor)
    assert ok["permute_over_floor"]["value"] == pytest.approx(1.3)
    assert ok["gemm_roofline_share"]["value"] == pytest.approx(1 / 1.2)
    below = metrics(permute=0.6 * permute_floor, gemm=0.9 * gemm_floor)
    assert below["permute_over_floor"]["value"] is None
    assert "read 0.6, below its physical floor of 1" in below["permute_over_floor"]["definition"]
    assert below["gemm_roofline_share"]["value"] is None
    assert "above its physical bound of 1" in below["gemm_roofline_share"]["definition"]


def test_the_sustained_matmul_rate_reads_the_gemms_in_the_power_state_a_long_layer_runs_in(
    tmp_path: Path,
) -> None:
    """A run from round 20 on stores the matmul back to back at the power limit beside its burst; the
    GEMMs' share of it is no bound (a short layer at boost clocks may pass 1), so it is never cut at 1."""
    matmul = MeasuredRate(name="dense_bf16_matmul", value=800.0, unit="TFLOP/s", work=1.0, definition="d")
    sustained = MeasuredRate(
        name="dense_bf16_matmul_sustained", value=680.0, unit="TFLOP/s", work=1.0, definition="d"
    )
    copy = MeasuredRate(name="hbm_copy", value=3000.0, unit="GB/s", work=2.0, definition="d")
    write_rates(tmp_path / "rates.json", [matmul, sustained, copy])
    rates, _ = run_rates(tmp_path)
    assert rates == DeviceRates(matmul_tflops=800.0, copy_gbps=3000.0, matmul_sustained_tflops=680.0)
    wl = Workload(hidden=8192, tokens_per_rank=4096)
    settings = E2ESpec(mode="tbo", intermediate=2048, backward=True).resolve(wl)
    w = LayerWork(pairs=32768, rows=4096, hidden=8192, intermediate=2048)
    gemm_us = w.gemm_flops(False) / 700e12 * 1e6  # 700 TFLOP/s: above the sustained rate, below the burst
    ops = _ops(
        layer=9000.0, layer_serial=8900.0, compute_only=8000.0, compute_only_split=8200.0, gemm=gemm_us,
        permute=2000.0, gemm_mb=2600.0, gemm_mb_under_comm=2600.0, dispatch=300.0, combine=200.0,
        layer_fwd_bwd=24000.0, layer_fwd_bwd_serial=23800.0,
    )  # fmt: skip
    got = {
        m["name"]: m for m in e2e_metrics(ops, settings, wl, [32768], {}, rows_per_rank=[4096], rates=rates)
    }
    assert got["dense_matmul_sustained_tflops"]["value"] == 680.0
    assert got["gemm_share_of_sustained_matmul"]["value"] == pytest.approx(700.0 / 680.0)
    # an older run's rates: the burst and the copy only, the sustained figure missing, not invented
    write_rates(tmp_path / "rates.json", [matmul, copy])
    old, _ = run_rates(tmp_path)
    assert old is not None and old.matmul_sustained_tflops is None
    got = {m["name"]: m for m in e2e_metrics(ops, settings, wl, [32768], {}, rows_per_rank=[4096], rates=old)}
    assert got["gemm_share_of_sustained_matmul"]["value"] is None
