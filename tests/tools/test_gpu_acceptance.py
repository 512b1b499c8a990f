"""tools/gpu_acceptance.py: its verdict logic, and a real run of the tool on one CPU rank (the 1-GPU path:
the multi-rank steps are skipped, each with its reason)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_acceptance.py"


def _tool():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", TOOL)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_acceptance"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_runnable_drops_test_plugins_and_honours_backend() -> None:
    t = _tool()
    avail = ["deepep", "nccl-a2a", "test-segv", "mxfp8-a2a"]
    assert t.runnable(avail, ()) == ["deepep", "nccl-a2a", "mxfp8-a2a"]
    assert t.runnable(avail, ("nccl-a2a",)) == ["nccl-a2a"]


def test_markdown_says_what_failed_and_why() -> None:
    t = _tool()
    steps = [
        t.StepResult(
            name="e2e", command="moelab run", status="failed", rc=1, problems=["exit code 1, expected 0"]
        ),
        t.StepResult(name="verify", command="", status="skipped", notes=["needs at least 2 ranks"]),
    ]
    summary = {
        "kind": "h200x2",
        "gpus": 2,
        "device": "cuda",
        "passed": False,
        "verdict": "FAILED",
        "wall_s": 12.0,
        "facts": {"torch": "2.11"},
        "steps": [vars(s) for s in steps],
    }
    text = t.markdown(summary)
    assert text.startswith("# GPU acceptance: h200x2 (2 cuda ranks): FAILED")
    assert "| e2e | failed | 0 | 1 | exit code 1, expected 0 |" in text
    assert "| verify | skipped | 0 |  | needs at least 2 ranks |" in text
    assert "## What failed" in text


def test_a_missing_gpu_is_one_error_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    t = _tool()
    assert t.main(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--gpus", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: no GPU visible: run with --cpu to try the tool on CPU ranks"]


@pytest.mark.slow
def test_one_rank_skips_the_multi_rank_steps_and_says_why(tmp_path: Path) -> None:
    """The 1-GPU path on one CPU rank: every step runs through `moelab` and passes, or is skipped with its
    reason; the summary says so in JSON and Markdown."""
    t = _tool()
    out = tmp_path / "out"
    rc = t.main(
        [
            "--cpu",
            "--gpus",
            "1",
            "--backend",
            "nccl-a2a",
            "--iters",
            "3",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "w"),
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    failed = {n: s["problems"] for n, s in steps.items() if s["status"] == "failed"}
    assert rc == 0 and summary["passed"], failed
    for name in ("repeat-sigterm", "a2a", "verify"):
        assert steps[name]["status"] == "skipped" and "2 ranks" in steps[name]["notes"][0]
    for name in ("doctor", "backends", "bench", "compare", "report", "model"):
        assert steps[name]["status"] == "passed", name
    assert any("ok" in n for n in steps["bench"]["notes"])
    assert "(1 cpu ranks): PASSED" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_a_signal_stops_the_tool_and_every_command_it_started(tmp_path: Path) -> None:
    """On 4xH200 the call's timeout killed the tool in its e2e step and the `moelab run` it had started kept
    running into the next call (measured there as contention): a signal to the tool now stops each command's
    process group and writes the summary."""
    import os
    import signal
    import subprocess
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(TOOL),
            "--cpu",
            "--backend",
            "nccl-a2a",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "w"),
        ],
        start_new_session=True,
    )
    log = out / "repeat-sigterm.log"
    deadline = time.monotonic() + 120
    while not (tmp_path / "w" / "runs" / "acc-repeat").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "w")], capture_output=True, text=True).stdout.split()
    assert [p for p in left if int(p) != os.getpid()] == []
    summary = json.loads((out / "summary.json").read_text())
    assert "SIGTERM" in summary["facts"]["stopped"]
    assert not log.exists() or "Traceback" not in log.read_text()


def test_a_spent_time_limit_skips_the_step_and_says_so(tmp_path: Path) -> None:
    t = _tool()
    s = t.parse_args(
        ["--cpu", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--time-limit", "5"]
    )
    r = t.Runner(s)
    res = r.command("report", ["--help"])
    assert res.status == "cut" and "time limit" in res.notes[0]
    # a step the limit cut is not a pass: what it proves was not shown
    r.skip("verify", "each library's own test needs at least 2 ranks")
    assert not r.passed() and r.verdict() == "INCOMPLETE"
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["verdict"] == "INCOMPLETE" and not summary["passed"]
    assert "): INCOMPLETE" in (tmp_path / "o" / "summary.md").read_text()


def test_one_suite_gives_each_backend_one_job_of_both_benchmarks(tmp_path: Path) -> None:
    """The a2a and e2e steps were two runs, so two job starts per backend (about 12 s each on a GPU): one
    suite now crosses `bench = ["a2a", "e2e"]`. Its dispatch/combine cases are the plain ones (the repeat
    run's ids, which the gate matches), the layer runs at default SMs only, a host job only dispatches."""
    from moelab.suites.loader import expand, load_suite

    t = _tool()
    s = t.parse_args(["--cpu", "--gpus", "2", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")])
    s = t.Settings(**{**vars(s), "sms": "default,16", "small": False})
    path = tmp_path / "bench.toml"
    t.bench_suite(path, ["nccl-a2a", "deepep", "nccl-tests"], s, a2a=True)
    cases = expand(load_suite(str(path)), ["nccl-a2a", "deepep", "nccl-tests"], world=2)
    ids = {(c.backend, c.case_id) for c in cases}
    assert ("nccl-a2a", "h8192-t4096-k8-e8-uniform-s0-bf16-smdef") in ids  # as the repeat run has it
    assert ("nccl-a2a", "h8192-t4096-k8-e8-uniform-s0-bf16-sm16") in ids
    kinds = {(c.backend, c.kind) for c in cases}
    assert kinds == {
        ("nccl-a2a", "a2a"),
        ("nccl-a2a", "e2e"),
        ("deepep", "a2a"),
        ("deepep", "e2e"),
        ("nccl-tests", "a2a"),
    }
    layer = [c for c in cases if c.kind == "e2e"]
    assert all(c.sms is None for c in layer)  # the layer at the library's default SMs
    assert {c.workload.dtype for c in layer if c.backend == "deepep"} == {"fp8"}
    assert len([c for c in layer if c.backend == "nccl-a2a"]) == 2 * 4  # bf16, fp8 x serial/tbo x fwd/fwd+bwd
    assert all("mode" not in c.knobs and "backward" not in c.knobs for c in cases if c.kind == "a2a")
    one_rank = tmp_path / "one.toml"
    t.bench_suite(one_rank, ["nccl-a2a", "nccl-tests"], s, a2a=False)
    assert {c.kind for c in expand(load_suite(str(one_rank)), ["nccl-a2a"], world=1)} == {"e2e"}


def test_a_bad_sms_list_is_one_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    t = _tool()
    with pytest.raises(SystemExit) as exc:
        t.parse_args(["--cpu", "--out", str(tmp_path / "o"), "--sms", "default,abc"])
    assert exc.value.code == 2
    assert (
        "--sms takes default or whole numbers of SMs, comma-separated, got 'abc'" in capsys.readouterr().err
    )


def test_a_step_the_time_limit_stops_is_cut_and_one_past_its_own_timeout_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On 2 x H200 the call's time limit stopped verify mid-run and the tool said `failed`: the step did not
    fail, the call's time ran out (INCOMPLETE). A step outliving its own timeout is a hang: `failed`."""
    t = _tool()
    monkeypatch.setattr(t, "MOELAB", [sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(t, "MIN_STEP_S", 1.0)
    s = t.parse_args(
        ["--cpu", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--time-limit", "3"]
    )
    r = t.Runner(s)
    res = r.command("verify", [], timeout_s=300)
    assert res.status == "cut" and not res.problems and "time limit" in res.notes[0]
    assert r.verdict() == "INCOMPLETE"
    s2 = t.parse_args(["--cpu", "--out", str(tmp_path / "o2"), "--work", str(tmp_path / "w2")])
    r2 = t.Runner(s2)
    res2 = r2.command("verify", [], timeout_s=2)
    assert res2.status == "failed" and "did not finish in 2 s" in res2.problems[0]
    assert r2.verdict() == "FAILED"


def test_the_doctor_step_names_the_worst_status_and_its_checks() -> None:
    """Both GPU summaries said `verdict ?`: the tool read a key doctor's JSON does not have."""
    t = _tool()
    out = json.dumps(
        {
            "worst": "warn",
            "findings": [
                {"check": "clock_under_load", "status": "warn"},
                {"check": "ecc", "status": "pass"},
                {"check": "temperature", "status": "warn"},
            ],
            "cluster": [{"check": "slowest_gpu", "status": "warn"}],
        }
    )
    assert t.doctor_note("note: x\n" + out) == "worst warn: clock_under_load, slowest_gpu, temperature"
    assert t.doctor_note(json.dumps({"worst": "pass", "findings": []})) == "worst pass"
