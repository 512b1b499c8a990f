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


def test_best_overlapped_schedule_per_backend_with_its_interval() -> None:
    """Per backend the overlapped case with the best forward speedup over serial is named, with both
    speedups, their intervals, the SMs it took from the GEMMs and serial's exposed share."""
    from moelab.core.intervals import Interval

    rows = [
        _row("deepep", "serial", 24, 380e3, schedule="serial", exposed_comm_share=0.2),
        _row("deepep", "tbo", 24, 400e3, schedule="tbo", speedup_vs_serial=1.05, sms_taken_from_gemms=24),
        _row("deepep", "expert", 24, 450e3, schedule="expert/4", speedup_vs_serial=1.18,
             speedup_vs_serial_fwd_bwd=1.1, sms_taken_from_gemms=24, speedup_ci=Interval(1.15, 1.2),
             speedup_fwd_bwd_ci=Interval(1.08, 1.12)),
        _row("nccl-a2a", "tbo", None, 300e3, schedule="tbo+zero-sm", speedup_vs_serial=0.97, sms_taken_from_gemms=0),
    ]  # fmt: skip
    (block,) = build(rows, draw=False)
    best = {b["backend"]: b for b in block["best_schedules"]}
    assert best["deepep"]["schedule"] == "expert/4" and best["deepep"]["speedup_ci"] == "[1.150, 1.200]"
    assert (
        best["deepep"]["speedup_fwd_bwd_ci"] == "[1.080, 1.120]"
        and best["deepep"]["serial_exposed_share"] == 0.2
    )
    assert best["deepep"]["schedules_tried"] == 2 and best["nccl-a2a"]["sms_taken"] == 0
    data = ReportData(runs=[], environment=[], results=[], not_measured=[], jobs=[], definitions=[])
    data.e2e = [block]
    md = render(data, "md")
    assert (
        "| deepep | expert/4 | 24 | 24 | 1.18 | [1.150, 1.200] | 1.1 | [1.080, 1.120] | 1.18 | — | — | — | 24 | 20% | 2 |"
        in md
    )
    assert "| nccl-a2a | tbo+zero-sm | default | 0 | 0.97 | — |" in md
    assert '<td class="l">expert/4</td>' in render(data, "html")


def test_best_schedule_is_held_to_the_fastest_serial_layer_at_any_sm_count() -> None:
    """What 4 x H200 showed at the reference on DeepEP (results/h200x4-r16): tbo at 8 SMs read 1.12x its own
    serial layer, itself held to 8 SMs, and was slower than the serial layer at the library's default. The
    fastest overlapped layer is named with both figures: 1.12 in-case, 0.91 against the best serial."""
    rows = [
        _row("deepep", "serial", None, 4096 / 7728e-6, schedule="serial"),
        _row("deepep", "tbo", 8, 4096 / 8503e-6, schedule="tbo+priority", speedup_vs_serial=1.121,
             speedup_vs_serial_fwd_bwd=1.053, tokens_per_s_per_rank_fwd_bwd=4096 / 23334e-6),
        _row("deepep", "tbo", None, 4096 / 9701e-6, schedule="tbo+priority", speedup_vs_serial=0.803,
             speedup_vs_serial_fwd_bwd=0.831, tokens_per_s_per_rank_fwd_bwd=4096 / 25112e-6),
    ]  # fmt: skip
    (block,) = build(rows, draw=False)
    (best,) = block["best_schedules"]
    assert best["sms"] == "8" and best["speedup"] == 1.121
    serial_default = (7728 + 9701 * 0.803) / 2  # the default's two readings: the serial case, tbo's baseline
    assert best["vs_best_serial"] == pytest.approx(serial_default / 8503)
    assert best["vs_best_serial"] < 0.92 and best["best_serial_sms"] == "default"
    assert best["vs_best_serial_fwd_bwd"] == pytest.approx(25112 * 0.831 / 23334)
    data = ReportData(runs=[], environment=[], results=[], not_measured=[], jobs=[], definitions=[])
    data.e2e = [block]
    assert "| 8 | shared | 1.12 | — | 1.05 | — | 0.912 | — | 0.894 | — | default |" in render(data, "md")


def test_mode_auto_having_chosen_serial_is_no_overlapped_layer() -> None:
    """auto:serial runs the serial layer and reads about 1x its own baseline: named as the fastest
    overlapped layer it hid the schedules that overlap (every block of results/h200x2-r6 named it)."""
    rows = [
        _row("deepep", "serial", None, 4096 / 7000e-6, schedule="serial"),
        _row("deepep", "auto", None, 4096 / 6990e-6, schedule="auto:serial", speedup_vs_serial=1.01),
        _row("deepep", "tbo", None, 4096 / 9800e-6, schedule="tbo", speedup_vs_serial=0.71),
        _row("nccl-a2a", "auto", None, 4096 / 6000e-6, schedule="auto:serial", speedup_vs_serial=1.0),
    ]  # fmt: skip
    (block,) = build(rows, draw=False)
    (best,) = block["best_schedules"]  # nccl-a2a overlapped nothing: no row
    assert (best["backend"], best["schedule"], best["speedup"], best["schedules_tried"]) == (
        "deepep",
        "tbo",
        0.71,
        1,
    )


def test_vs_best_serial_has_an_interval_from_both_sides_iterations() -> None:
    """The fastest overlapped layer against the fastest serial layer: unpaired, the overlapped case's
    iterations against the serial iterations of every case at the best serial SM count (a serial case's
    own layer, an overlapped case's in-case baseline), pooled."""
    from moelab.reports.e2e_section import vs_best_serial_interval

    serial = [7000.0, 7100.0, 6900.0, 7050.0, 6950.0]
    rows = [
        _row("deepep", "serial", None, 4096 / 7000e-6, schedule="serial", samples={"layer": serial}),
        _row("deepep", "tbo", 8, 4096 / 8000e-6, schedule="tbo", speedup_vs_serial=1.1,
             samples={"layer": [8000.0, 8100.0, 7900.0, 8050.0], "layer_serial": [8800.0] * 4}),
        _row("deepep", "tbo", None, 4096 / 9000e-6, schedule="tbo", speedup_vs_serial=0.78,
             samples={"layer": [9000.0] * 4, "layer_serial": [7020.0, 6980.0, 7010.0, 6990.0]}),
    ]  # fmt: skip
    (block,) = build(rows, draw=False)
    (best,) = block["best_schedules"]
    assert best["sms"] == "8" and best["best_serial_sms"] == "default"
    low, high = (float(x) for x in best["vs_best_serial_ci"].strip("[]").split(", "))
    assert 0.85 < low < best["vs_best_serial"] < high < 0.90  # 7000 / 8000, the 8-SM serial left out
    ci = vs_best_serial_interval(rows, rows[1], "fwd", None)
    assert ci is not None and ci.low > 7000 * 0.99 / 8100 and ci.high < 7020 * 1.01 / 7900
    assert vs_best_serial_interval(rows, rows[1], "fwd_bwd", None) is None  # no samples: no interval
    assert best["vs_best_serial_fwd_bwd_ci"] == "—"


def test_best_serial_is_the_fastest_sm_counts_median_reading() -> None:
    """Per SM count the median of its readings (not the minimum: one low reading of many cases is noise),
    then the fastest SM count; nothing read, nothing named."""
    from moelab.reports.e2e_section import best_serial

    assert best_serial([(8, 100.0), (8, 90.0), (8, 200.0), (None, 120.0)]) == (8, 100.0)
    assert best_serial([(8, 100.0), (None, 95.0), (None, 99.0)]) == (None, 97.0)
    assert best_serial([]) is None


def test_speedup_intervals_pair_the_iterations_of_a_case_timed_interleaved() -> None:
    """A schedule 5% faster than serial, both read while the machine slowed 40% over the iterations: a case
    whose record says it timed the two interleaved gets the paired interval (above 1), one from before gets the unpaired
    one, which the drift widens past 1."""
    import duckdb
    import numpy as np

    from moelab.reports.e2e_section import speedup_intervals

    con = duckdb.connect()
    con.execute("CREATE TABLE samples (run_id VARCHAR, backend VARCHAR, case_id VARCHAR, op VARCHAR, "
                "rank INTEGER, iter INTEGER, time_us DOUBLE)")  # fmt: skip
    con.execute(
        "CREATE TABLE cases (run_id VARCHAR, backend VARCHAR, case_id VARCHAR, backend_record VARCHAR)"
    )
    con.execute("""INSERT INTO cases VALUES ('r', 'b', 'new', '{"e2e": {"serial_timing": "interleaved"}}'),
                   ('r', 'b', 'old', '{"e2e": {}}')""")  # fmt: skip
    con.execute("CREATE TEMP TABLE _sel AS SELECT 'r' AS run_id")
    drift = np.linspace(1.0, 1.4, 8)
    jitter = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01]
    for case in ("new", "old"):
        for rank in (0, 1):
            for i in range(8):
                for op, t in (("layer_serial", 1000.0 * drift[i]), ("layer", 950.0 * drift[i] * jitter[i])):
                    con.execute(
                        "INSERT INTO samples VALUES ('r', 'b', ?, ?, ?, ?, ?)", [case, op, rank, i, t]
                    )
    got = speedup_intervals(con)
    paired, unpaired = got[("r", "b", "new")]["fwd"], got[("r", "b", "old")]["fwd"]
    assert paired is not None and 1.0 < paired.low <= paired.high < 1.1
    assert unpaired is not None and unpaired.covers(1.0)
