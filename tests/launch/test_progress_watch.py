"""The console's progress of a backend job, from a synthetic progress.jsonl written as a worker would."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from moelab.job.events import ProgressEvents, one_time_costs, read_events
from moelab.launch.progress import JobProgress, JobWatch, watch_job
from moelab.plan.case_list import NOT_RUN

CASES = ["h256-t64-smdef", "h256-t64-sm16", "h256-t64-sm24"]


def _console(tty: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=tty, width=200, highlight=False, markup=False), buf


def _write(path: Path, *events: dict[str, object]) -> None:
    with path.open("a") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


def test_writer_lines_are_whole_events_with_times(tmp_path: Path) -> None:
    events = ProgressEvents.for_job(tmp_path / "nccl-a2a")
    with events.timed_setup("communicator"):
        pass
    events.setup("jit", 2.5)
    events.case_start(CASES[0])
    events.case_start(CASES[0], "dispatch")
    events.case_end(CASES[0], "ok")
    lines = [json.loads(s) for s in (tmp_path / "nccl-a2a" / "progress.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["setup", "setup", "case_start", "case_start", "case_end"]
    assert all(isinstance(e["t"], float) for e in lines)
    assert lines[1] == lines[1] | {"what": "jit", "seconds": 2.5}
    assert lines[3]["op"] == "dispatch"
    assert lines[4]["status"] == "ok" and lines[4]["seconds"] >= 0


def test_disabled_writer_writes_nothing(tmp_path: Path) -> None:
    events = ProgressEvents.for_job(tmp_path / "b", enabled=False)
    events.case_start("x")
    events.case_end("x", "ok")
    assert not (tmp_path / "b").exists()


def test_read_events_leaves_a_half_written_line_for_later(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text('{"event": "case_start", "case_id": "a"}\n{"event": "case_en')
    events, offset = read_events(path)
    assert [e["case_id"] for e in events] == ["a"]
    with path.open("a") as fh:
        fh.write('d", "case_id": "a", "status": "ok"}\nnot json\n')
    more, offset2 = read_events(path, offset)
    assert [e["event"] for e in more] == ["case_end"]
    assert offset2 == path.stat().st_size
    assert read_events(tmp_path / "missing.jsonl", 7) == ([], 7)


def test_one_time_costs_add_up_per_kind(tmp_path: Path) -> None:
    _write(
        tmp_path / "progress.jsonl",
        {"event": "setup", "what": "communicator", "seconds": 1.25, "t": 1.0},
        {"event": "setup", "what": "buffers", "seconds": 0.5, "t": 2.0},
        {"event": "case_start", "case_id": "a", "op": None, "t": 3.0},
        {"event": "setup", "what": "buffers", "seconds": 0.25, "t": 4.0},
        {"event": "setup", "what": "jit", "seconds": 7.0, "t": 5.0},
    )
    assert one_time_costs(tmp_path) == {"communicator": 1.25, "buffers": 0.75, "jit": 7.0}
    assert one_time_costs(tmp_path / "progress.jsonl") == one_time_costs(tmp_path)
    assert one_time_costs(tmp_path / "nothing-here") == {}


def test_state_tracks_running_case_op_and_estimate() -> None:
    state = JobProgress(num_cases=4, started=100.0)
    assert state.estimate_left(now=101.0) is None
    state.apply({"event": "case_start", "case_id": "a", "op": None, "t": 100.0})
    state.apply({"event": "case_start", "case_id": "a", "op": "combine", "t": 101.0})
    assert (state.case_id, state.op, state.case_started) == ("a", "combine", 100.0)
    state.apply({"event": "case_end", "case_id": "a", "status": "ok", "seconds": 4.0, "t": 104.0})
    state.apply({"event": "case_start", "case_id": "b", "op": None, "t": 104.0})
    state.apply({"event": "case_end", "case_id": "b", "status": "unsupported", "t": 106.0})  # no seconds
    assert state.done == 2 and state.case_seconds == [4.0, 2.0]
    assert state.statuses == {"ok": 1, "unsupported": 1}
    # the cases left are held against the measured one (4 s), not against the unsupported one's 2 s
    assert state.estimate_left(now=106.0) == pytest.approx(2 * 4.0)
    state.apply({"event": "case_start", "case_id": "c", "op": None, "t": 106.0})
    assert state.estimate_left(now=107.0) == pytest.approx(2 * 4.0 - 1.0)
    assert state.estimate_left(now=200.0) == pytest.approx(4.0)  # a slow case never drives it below 0
    assert state.elapsed(now=110.0) == pytest.approx(10.0)


def test_estimate_holds_each_case_against_finished_cases_of_its_kind() -> None:
    """A first CPU run: one measured case (49 s), then four SM-sweep cases gloo cannot run. The estimate
    after the first case is what those four cost, none, not 4 x 49 s."""
    kinds = {"smdef": "a2a", "sm8": NOT_RUN, "sm16": NOT_RUN, "sm24": NOT_RUN, "sm32": NOT_RUN}
    state = JobProgress(num_cases=5, kinds=kinds, started=0.0)
    state.apply({"event": "case_start", "case_id": "smdef", "op": None, "t": 0.0})
    state.apply({"event": "case_end", "case_id": "smdef", "status": "ok", "seconds": 49.0, "t": 49.0})
    assert state.estimate_left(now=49.0) == pytest.approx(0.0)
    # a measured kind is held against its own kind; one not seen yet, against the measured cases so far
    mixed = JobProgress(num_cases=4, kinds={"a": "a2a", "b": NOT_RUN, "c": "a2a", "d": "e2e"}, started=0.0)
    for cid, status, secs in (("a", "ok", 10.0), ("b", "unsupported", 0.1)):
        mixed.apply({"event": "case_start", "case_id": cid, "op": None, "t": 0.0})
        mixed.apply({"event": "case_end", "case_id": cid, "status": status, "seconds": secs, "t": 0.0})
    assert mixed.estimate_left(now=0.0) == pytest.approx(10.0 + 10.0)


def test_plain_output_is_one_line_per_case_and_per_one_time_cost(tmp_path: Path) -> None:
    job_dir = tmp_path / "hybrid-ep"
    job_dir.mkdir()
    console, buf = _console(tty=False)
    watch = JobWatch(job_dir, len(CASES), 2, "cuda", quiet=False, console=console)
    _write(job_dir / "progress.jsonl", {"event": "setup", "what": "jit", "seconds": 12.0, "t": 1.0})
    for i, case in enumerate(CASES):
        _write(
            job_dir / "progress.jsonl",
            {"event": "case_start", "case_id": case, "op": None, "t": 10.0 + i},
            {"event": "case_start", "case_id": case, "op": "dispatch", "t": 10.2 + i},
            {"event": "case_end", "case_id": case, "status": "ok", "seconds": 0.9, "t": 10.9 + i},
        )
        watch.poll()
    watch.stop()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[hybrid-ep] one-time jit: 12 s"
    case_lines = [s for s in lines if " case " in s]
    assert len(case_lines) == len(CASES)
    for i, (line, case) in enumerate(zip(case_lines, CASES, strict=True)):
        assert line.startswith(f"[hybrid-ep] case {i + 1}/3 {case}: ok in 0.9 s on 2 cuda ranks · elapsed ")
    assert case_lines[0].endswith("about 1.8 s left")
    assert case_lines[-1].endswith("about 0.0 s left")
    assert lines[-1] == "[hybrid-ep] one-time costs (not in any measurement): jit 12 s"
    assert watch.state.setup_s == {"jit": 12.0}


def test_quiet_shows_nothing_but_keeps_the_costs(tmp_path: Path) -> None:
    job_dir = tmp_path / "deepep"
    console, buf = _console(tty=True)
    with watch_job(job_dir, 1, 2, "cpu", quiet=True, console=console) as watch:
        events = ProgressEvents.for_job(job_dir)
        events.setup("buffers", 0.5)
        events.case_start(CASES[0])
        events.case_end(CASES[0], "ok")
    assert buf.getvalue() == ""
    assert watch.state.setup_s == {"buffers": 0.5} and watch.state.done == 1


def test_terminal_shows_a_live_bar_with_the_running_case(tmp_path: Path) -> None:
    job_dir = tmp_path / "nccl-a2a"
    console, buf = _console(tty=True)
    with watch_job(job_dir, len(CASES), 4, "cuda", quiet=False, console=console) as watch:
        events = ProgressEvents.for_job(job_dir)
        events.setup("communicator", 1.5)
        events.case_start(CASES[0])
        events.case_end(CASES[0], "ok")
        events.case_start(CASES[1])
        events.case_start(CASES[1], "combine")
        watch.poll()
        running = watch._running()
    out = buf.getvalue()
    assert running == f"{CASES[1]} · combine · 4 cuda ranks"
    assert "[nccl-a2a]" in out and "1/3" in out
    assert "one-time communicator: 1.5 s" in out
    assert "one-time costs (not in any measurement): communicator 1.5 s" in out
