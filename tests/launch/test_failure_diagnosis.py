"""Why a job failed, from real CPU ranks: a backend that raises in its constructor, one that aborts, one
that hangs. Each run's exception, per-rank log tails and (for the hang) every rank's Python stack at the
kill reach the store, the console summary and the report. Plus the faulthandler parsing on a real dump."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.job.diagnosis import (
    main_thread_frame,
    parse_faulthandler,
    read_diagnosis,
    request_stack_dumps,
)
from moelab.job.rundir import JobFiles
from moelab.reports.html import write_report
from tests.launch.test_crash_isolation import SMALL


def _run(backend: str, runs: Path, timeout: int) -> tuple[str, Path]:
    args = ["run", "--backend", backend, "--cpu", "--out", str(runs), "--timeout", str(timeout),
            "--collective-timeout", "8", "--no-health", *SMALL]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    return result.output, next(runs.iterdir())


def _diagnosis(db_path: Path, backend: str) -> list[dict[str, object]]:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        cur = con.execute("SELECT * FROM failure_diagnosis WHERE backend = ? ORDER BY rank", [backend])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


@pytest.mark.slow
def test_constructor_exception_is_named(plugin_path: Path, db_path: Path, tmp_path: Path) -> None:
    output, run_dir = _run("test-ctor-raise", tmp_path / "runs", 60)
    err = json.loads((run_dir / "test-ctor-raise" / "rank0.error.json").read_text())
    assert err["type"] == "ValueError" and "refusing to build on rank 0" in err["message"]
    assert "CtorRaiseBackend" in err["traceback"] or "__init__" in err["traceback"]
    rows = _diagnosis(db_path, "test-ctor-raise")
    assert {r["rank"] for r in rows} == {0, 1}
    assert any(r["exc_type"] == "ValueError" for r in rows)
    assert all(r["log_tail"] for r in rows)
    headline = str(rows[0]["headline"])
    assert "ValueError: test-ctor-raise: refusing to build on rank" in headline
    assert "cause: rank" in output and "ValueError: test-ctor-raise" in output
    report = write_report(db_path, None, tmp_path / "r.html").read_text()
    assert "ValueError: test-ctor-raise: refusing to build on rank" in report
    md = write_report(db_path, None, tmp_path / "r.md", fmt="md").read_text()
    assert "ValueError: test-ctor-raise" in md


@pytest.mark.slow
def test_abort_is_named_with_its_stack(plugin_path: Path, db_path: Path, tmp_path: Path) -> None:
    output, _ = _run("test-abort", tmp_path / "runs", 60)
    rows = _diagnosis(db_path, "test-abort")
    bad = next(r for r in rows if r["rank"] == 1)
    assert bad["exc_type"] == "Fatal Python error" and "Abort" in str(bad["exc_message"])
    assert bad["stack_trigger"] == "fatal" and "in misbehave" in str(bad["stack_where"])
    assert bad["root_cause"] is True
    assert "rank 1: Fatal Python error: Aborted" in str(bad["headline"])
    assert "Fatal Python error: Aborted" in output


@pytest.mark.slow
def test_hang_records_every_ranks_stack_at_the_kill(plugin_path: Path, db_path: Path, tmp_path: Path) -> None:
    output, run_dir = _run("test-hang-all", tmp_path / "runs", 20)
    job = json.loads((run_dir / "test-hang-all" / "job.json").read_text())
    assert job["timed_out"] and job["leftover_pids"] == []
    rows = _diagnosis(db_path, "test-hang-all")
    assert {r["rank"] for r in rows} == {0, 1}
    for r in rows:
        assert r["stack_trigger"] == "timeout", r
        assert "moelab_testplugins.py" in str(r["stack_where"]) and "in dispatch" in str(r["stack_where"])
        assert "worker.py" in str(r["stack"])
    assert "stuck at moelab_testplugins.py" in str(rows[0]["headline"])
    assert "stuck at moelab_testplugins.py" in output
    report = write_report(db_path, None, tmp_path / "r.html").read_text()
    assert "stuck at moelab_testplugins.py" in report


_SLEEPER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from moelab.job.diagnosis import install_stack_dumps

    def waiting_here():  # "ready" from inside the frame the dump must name: no race with the signal
        print("ready", flush=True); time.sleep(60)

    install_stack_dumps(Path(sys.argv[1]), 3)
    waiting_here()
    """
)


def test_sigusr1_dump_names_the_frame_and_the_process_goes_on(tmp_path: Path) -> None:
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "moelab_fake_worker.py").write_text(_SLEEPER)
    # a worker is recognised by its command line (the module after python's first -m): this stand-in
    # carries `-m moelab.measure.worker` as arguments; an agent-shaped one (`-m torch.distributed.run ...
    # -m moelab.measure.worker`) sleeping beside it must not be signalled
    run = f"import runpy; runpy.run_path({str(pkg / 'moelab_fake_worker.py')!r}, run_name='__main__')"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "-m",
            "torch.distributed.run",
            "-m",
            "moelab.measure.worker",
        ]
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", run, str(tmp_path), "-m", "moelab.measure.worker"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert request_stack_dumps([proc.pid, agent.pid, os.getpid()], wait_s=1.0) == [proc.pid]
        assert agent.poll() is None
        assert proc.poll() is None  # SIGUSR1 dumps, it does not kill
        text = JobFiles.of_dir(tmp_path).stack_file(3).read_text()
        assert main_thread_frame(parse_faulthandler(text)) == "moelab_fake_worker.py:7 in waiting_here"
        diag = read_diagnosis(tmp_path)
        assert [s.line() for s in diag.stacks] == ["rank 3 stuck at moelab_fake_worker.py:7 in waiting_here"]
        assert diag.headline() == "rank 3 stuck at moelab_fake_worker.py:7 in waiting_here"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGTERM  # chained to the default action after the dump
    finally:
        agent.kill()
        agent.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def test_consequences_do_not_hide_the_cause(tmp_path: Path) -> None:
    for rank, (etype, msg) in enumerate(
        [
            ("RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
            ("KeyError", "'x'"),
        ]
    ):
        (tmp_path / f"rank{rank}.error.json").write_text(
            json.dumps({"type": etype, "message": msg, "traceback": ""})
        )
        (tmp_path / f"rank{rank}.log").write_text(f"line a\n{etype}: {msg}\n")
    diag = read_diagnosis(tmp_path)
    assert diag.headline() == "rank 1: KeyError: 'x'"
    assert diag.tails[0].endswith("Connection closed by peer\n")


def test_the_earliest_cause_is_the_root(tmp_path: Path) -> None:
    """Rank 1 raised first; rank 0 aborted later (as NCCL's watchdog does after a peer failed)."""
    (tmp_path / "rank1.error.json").write_text(
        json.dumps({"type": "ValueError", "message": "bad", "traceback": ""})
    )
    (tmp_path / "rank1.log").write_text("ValueError: bad\n")
    (tmp_path / "rank0.log").write_text(
        "Fatal Python error: Aborted\n\nCurrent thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/x/moelab/measure/worker.py", line 9 in main\n'
    )
    os.utime(tmp_path / "rank1.error.json", (1000, 1000))
    os.utime(tmp_path / "rank0.log", (2000, 2000))
    diag = read_diagnosis(tmp_path)
    assert diag.headline() == "rank 1: ValueError: bad; rank 0: Fatal Python error: Aborted"
    assert [s.line() for s in diag.stacks] == ["rank 0 crashed at worker.py:9 in main"]
    os.utime(tmp_path / "rank0.log", (500, 500))
    assert (
        read_diagnosis(tmp_path).headline() == "rank 0: Fatal Python error: Aborted; rank 1: ValueError: bad"
    )


def test_install_is_harmless_when_nothing_happens(tmp_path: Path) -> None:
    code = "import sys; from pathlib import Path; from moelab.job.diagnosis import install_stack_dumps; " \
        "install_stack_dumps(Path(sys.argv[1]), 0); print('ok')"  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok"
    assert read_diagnosis(tmp_path).headline() is None
