"""IB counter sampling against a fake sysfs tree (moelab.measure.ib_counters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moelab.measure.ib_counters import COUNTER32_MAX, delta, sample

NDR = "400 Gb/sec (4X NDR)"


def _port(
    root: Path,
    dev: str,
    port: int,
    xmit: int | None,
    rcv: int | None,
    state: str = "4: ACTIVE",
    rate: str = NDR,
    ext64: bool = False,
) -> None:
    d = root / dev / "ports" / str(port)
    counters = d / ("counters_ext" if ext64 else "counters")
    counters.mkdir(parents=True, exist_ok=True)
    suffix = "_64" if ext64 else ""
    for name, value in ((f"port_xmit_data{suffix}", xmit), (f"port_rcv_data{suffix}", rcv)):
        f = counters / name
        if value is None:
            f.unlink(missing_ok=True)
        else:
            f.write_text(f"{value}\n")
    (d / "state").write_text(state + "\n")
    (d / "rate").write_text(rate + "\n")
    (d / "link_layer").write_text("InfiniBand\n")


def _clock(*times: float):
    it = iter(times)
    return lambda: next(it)


def test_no_devices_is_none_not_zero(tmp_path: Path) -> None:
    assert sample(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert sample(tmp_path / "empty") is None
    assert delta(None, None, 1.0) is None


def test_words_are_four_bytes_and_asymmetric_ports_stay_visible(tmp_path: Path) -> None:
    # like the seeds' Azure ND H100 v5: mlx5_ib6 receives normally but transmits next to nothing
    for i in range(8):
        _port(tmp_path, f"mlx5_ib{i}", 1, 1000, 1000)
    before = sample(tmp_path, clock=_clock(10.0))
    for i in range(8):
        xmit = 1000 + (10 if i == 6 else 4_000_000_000)  # 16 GB vs 40 bytes
        _port(tmp_path, f"mlx5_ib{i}", 1, xmit, 1000 + 4_000_000_000)
    after = sample(tmp_path, clock=_clock(11.0))
    assert before is not None and after is not None
    d = delta(before, after)
    assert d is not None and d.complete and d.elapsed_s == 1.0
    by_dev = {p.device: p for p in d.ports}
    assert by_dev["mlx5_ib0"].xmit_bytes == 16_000_000_000
    assert by_dev["mlx5_ib0"].xmit_gbps == pytest.approx(16.0)
    assert by_dev["mlx5_ib6"].xmit_bytes == 40
    assert by_dev["mlx5_ib6"].rcv_gbps == pytest.approx(16.0)
    assert d.xmit_bytes == 7 * 16_000_000_000 + 40
    assert d.rcv_gbps == pytest.approx(8 * 16.0)
    assert all(p.status == "ok" and p.rate_gbps == 400.0 for p in d.ports)


def test_word_size_is_a_parameter(tmp_path: Path) -> None:
    _port(tmp_path, "bnxt_re0", 1, 0, 0)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "bnxt_re0", 1, 100, 50)
    d = delta(before, sample(tmp_path, clock=_clock(2.0)), word_bytes=1)
    assert d is not None and (d.xmit_bytes, d.rcv_bytes, d.word_bytes) == (100, 50, 1)


def test_32bit_wrap_is_corrected_when_one_wrap_is_certain(tmp_path: Path) -> None:
    _port(tmp_path, "mlx4_0", 1, COUNTER32_MAX - 99, 5)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx4_0", 1, 400, 10)
    # 0.1 s at 400 Gb/s carries at most ~1.4e9 words < 2^32: a single wrap
    d = delta(before, sample(tmp_path, clock=_clock(0.1)))
    assert d is not None
    (p,) = d.ports
    assert p.status == "ok" and p.wrapped
    assert p.xmit_bytes == (100 + 400) * 4
    assert p.rcv_bytes == 20


def test_32bit_wrap_over_a_long_interval_is_ambiguous(tmp_path: Path) -> None:
    _port(tmp_path, "mlx4_0", 1, 3_000_000_000, 5)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx4_0", 1, 1_000, 10)
    d = delta(before, sample(tmp_path, clock=_clock(5.0)))  # 5 s: several wraps possible
    assert d is not None
    (p,) = d.ports
    assert p.status == "ambiguous_wrap" and p.xmit_bytes is None and p.xmit_gbps is None
    assert p.rcv_bytes == 20  # the other direction's counter is independent and still known
    assert d.unknown_ports == ("mlx4_0/1",) and not d.complete
    assert (d.xmit_bytes, d.rcv_bytes) == (0, 20)


def test_saturated_legacy_counter_gives_no_bytes(tmp_path: Path) -> None:
    _port(tmp_path, "mlx4_0", 1, 100, 100)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx4_0", 1, COUNTER32_MAX, 200)
    d = delta(before, sample(tmp_path, clock=_clock(0.01)))
    assert d is not None and d.ports[0].status == "saturated" and d.ports[0].xmit_bytes is None


def test_64bit_counters_never_treated_as_wrapping(tmp_path: Path) -> None:
    big = 1 << 40
    _port(tmp_path, "mlx5_0", 1, big, big, ext64=True)
    before = sample(tmp_path, clock=_clock(0.0))
    assert before is not None and before.ports[0].counter_bits == 64
    _port(tmp_path, "mlx5_0", 1, COUNTER32_MAX, big + 8, ext64=True)  # went down: a reset, not a wrap
    d = delta(before, sample(tmp_path, clock=_clock(0.01)))
    assert d is not None and d.ports[0].status == "reset" and d.ports[0].xmit_bytes is None
    # a 64-bit value above 2^32 read from counters/ (kernel >= 4.5) going down is a reset too
    _port(tmp_path / "k", "mlx5_1", 1, big, big)
    before = sample(tmp_path / "k", clock=_clock(0.0))
    _port(tmp_path / "k", "mlx5_1", 1, 10, big + 1)
    d = delta(before, sample(tmp_path / "k", clock=_clock(0.01)))
    assert d is not None and d.ports[0].status == "reset"


def test_port_going_down_mid_run_is_marked_not_zeroed(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, 0, 0)
    _port(tmp_path, "mlx5_1", 1, 0, 0)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx5_0", 1, 250, 250)
    _port(tmp_path, "mlx5_1", 1, 125, 125, state="1: DOWN", rate="10 Gb/sec (4X SDR)")
    d = delta(before, sample(tmp_path, clock=_clock(1.0)))
    assert d is not None
    p0, p1 = d.ports
    assert (p0.status, p1.status) == ("ok", "not_active")
    assert (p1.state_before, p1.state_after) == ("ACTIVE", "DOWN")
    assert p1.xmit_bytes == 500  # what it did carry before going down is real
    assert d.complete


def test_port_vanishing_mid_run_has_no_bytes(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, 0, 0)
    _port(tmp_path, "mlx5_1", 1, 0, 0)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx5_0", 1, 250, 250)
    _port(tmp_path, "mlx5_1", 1, None, None, state="1: DOWN")  # counters unreadable
    d = delta(before, sample(tmp_path, clock=_clock(1.0)))
    assert d is not None
    assert d.ports[1].status == "vanished" and d.ports[1].xmit_bytes is None
    assert d.xmit_bytes == 1000 and d.unknown_ports == ("mlx5_1/1",)


def test_port_appearing_is_reported(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, 0, 0)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx5_0", 2, 7, 7)
    d = delta(before, sample(tmp_path, clock=_clock(1.0)))
    assert d is not None and [p.status for p in d.ports] == ["ok", "appeared"]


def test_sample_parses_state_rate_and_ignores_non_port_entries(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, 1, 2, state="4: ACTIVE", rate="200 Gb/sec (2X NDR)")
    (tmp_path / "mlx5_0" / "ports" / "README").mkdir()
    (tmp_path / "stray").mkdir()
    s = sample(tmp_path, clock=_clock(3.0))
    assert s is not None and s.taken_s == 3.0
    (p,) = s.ports
    assert (p.name, p.state, p.rate_gbps, p.link_layer, p.counter_bits) == (
        "mlx5_0/1",
        "ACTIVE",
        200.0,
        "InfiniBand",
        None,
    )


def test_elapsed_must_be_positive(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, 0, 0)
    s = sample(tmp_path, clock=_clock(1.0))
    with pytest.raises(ValueError):
        delta(s, s)


def test_to_dict_round_trips_through_json(tmp_path: Path) -> None:
    import json

    _port(tmp_path, "mlx5_0", 1, 0, 0)
    before = sample(tmp_path, clock=_clock(0.0))
    _port(tmp_path, "mlx5_0", 1, 10, 10)
    d = delta(before, sample(tmp_path, clock=_clock(1.0)))
    assert d is not None
    data = json.loads(json.dumps(d.to_dict()))
    assert data["ports"][0]["xmit_bytes"] == 40 and data["word_bytes"] == 4
