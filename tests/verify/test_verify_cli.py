"""`moelab verify` end to end on CPU: the library's benchmark runs through the real subprocess path (a fake
alltoall_perf; a fake DeepEP test_intranode.py in a fake source tree, both test fixtures), its figures are
parsed, stored in the run beside moelab's, printed with verdicts, and shown in the report.

The nccl-tests case is real on both sides (moelab's nccl-tests backend runs the same fake binary). For DeepEP,
which cannot run on CPU, moelab's measurement is replaced by a run directory written here with known
`deepep_nvl` figures; everything after it (the library run, parsing, comparison, store, exit code) is real."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moelab.cli.main import app
from moelab.core.case_record import CaseRecord
from moelab.core.record_build import OpMeasurement, op_result
from moelab.core.rows import RankRows
from moelab.core.spec import RunSpec
from moelab.job.local import JobOutcome
from moelab.job.rundir import RunDir
from moelab.launch.runner import RunOutcome
from moelab.store.db import connect
from moelab.store.ingest import ingest
from moelab.verify import measure
from moelab.verify.plan import library_way_knobs
from tests.argv import with_flags

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "verify"
runner = CliRunner()


def _fake_binary(tmp_path: Path, rates: list[float], monkeypatch: pytest.MonkeyPatch) -> Path:
    exe = tmp_path / "bin" / "alltoall_perf"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n" + (FIX / "fake_alltoall_perf.py").read_text())
    exe.chmod(0o755)
    (tmp_path / "rates").write_text("\n".join(map(str, rates)))
    monkeypatch.setenv("FAKE_A2A_GBPS", str(tmp_path / "rates"))
    return exe


def _args(tmp_path: Path, *extra: str) -> list[str]:
    base = ["--cpu", "--no-health", "--hidden", "1024", "--tokens-per-rank", "64", "--db",
            str(tmp_path / "m.duckdb"), "--out", str(tmp_path / "runs")]  # fmt: skip
    return ["verify", *with_flags(base, *extra)]


def _stored(tmp_path: Path) -> list[tuple[Any, ...]]:
    con = connect(tmp_path / "m.duckdb", read_only=True)
    try:
        return con.execute(
            "SELECT backend, op, dtype, figure, library_gbps, moelab_gbps, ratio, verdict, source_log, note "
            "FROM library_figures ORDER BY backend, dtype, op, figure"
        ).fetchall()
    finally:
        con.close()


def test_nccl_tests_pass_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _fake_binary(tmp_path, [200.0], monkeypatch)
    res = runner.invoke(app, _args(tmp_path, "--backend", "nccl-tests", "--nccl-tests-bin", str(exe), "--dtype", "bf16",
                                   "--report", str(tmp_path / "r.html")))  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = _stored(tmp_path)
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[7]) for r in rows] == [
        ("nccl-tests", "alltoall", "bf16", "nccl_algbw", 200.0, 200.0, "pass"),
        ("nccl-tests", "alltoall", "bf16", "nccl_busbw", 100.0, 100.0, "pass"),
    ]
    run_dir = next((tmp_path / "runs").iterdir())
    log = run_dir / rows[0][8]
    assert log.read_text().startswith(f"# {exe} -b ") and "nccl_algbw" in res.output and "pass" in res.output
    assert json.loads((run_dir / "verify" / "library_figures.json").read_text())[0]["verdict"] == "pass"
    html = (tmp_path / "r.html").read_text()
    assert 'id="verification"' in html and "alltoall_perf" in html


def test_nccl_tests_mismatch_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # moelab's backend job is the first invocation (200 GB/s), the library's own the second (250 GB/s)
    exe = _fake_binary(tmp_path, [200.0, 250.0], monkeypatch)
    res = runner.invoke(
        app, _args(tmp_path, "--backend", "nccl-tests", "--nccl-tests-bin", str(exe), "--dtype", "bf16")
    )
    assert res.exit_code == 1, res.output
    algbw = _stored(tmp_path)[0]
    assert (algbw[4], algbw[5], algbw[6], algbw[7]) == (250.0, 200.0, pytest.approx(0.8), "fail")


def test_repeats_give_moelabs_figure_over_its_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--repeat 3: moelab's three starts of its nccl-tests job measure 190, 200 and 245 GB/s, the library's
    own run 250; moelab's figure is the median start's (200: a fail at 0.8), and the note gives the range
    over the starts (0.76-0.98), which reaches into the tolerance band: within moelab's own spread."""
    exe = _fake_binary(tmp_path, [190.0, 200.0, 245.0, 250.0], monkeypatch)
    res = runner.invoke(
        app,
        _args(
            tmp_path,
            "--backend",
            "nccl-tests",
            "--nccl-tests-bin",
            str(exe),
            "--dtype",
            "bf16",
            "--repeat",
            "3",
        ),
    )
    assert res.exit_code == 1, res.output
    algbw = _stored(tmp_path)[0]
    assert (algbw[4], algbw[5], algbw[6], algbw[7]) == (250.0, 200.0, pytest.approx(0.8), "fail")
    assert re.search(
        r"moelab over 3 starts: ratio 0\.7[56]\d-0\.9[78]\d", algbw[9]
    )  # times printed to 0.01 µs
    assert "the verdict is within moelab's spread between processes" in algbw[9]


# --- DeepEP through a fake source tree --------------------------------------------------------------------

MOELAB_NVL = {
    ("bf16", "dispatch"): 330.0,
    ("fp8", "dispatch"): 230.0,
    ("bf16", "combine"): 280.0,
    ("fp8", "combine"): 279.0,
}


def _fake_measure(spec: RunSpec, runs_root: Path, db_path: Path, progress: Any) -> RunOutcome:
    """A run directory with one ok record per case, ingested, then moelab's deepep_nvl set to MOELAB_NVL."""
    rd = RunDir.create(runs_root, spec)
    for backend in spec.backends:
        files = rd.job(backend)
        files.write_job({"backend": backend, "returncode": 0, "signal": None, "timed_out": False, "duration_s": 1.0,
                         "failed_ranks": [], "stderr_tails": {}, "argv": [], "description": "ok"})  # fmt: skip
        for case in spec.cases_for(backend):
            rows = tuple(RankRows(rank=r, recv_rows=64, recv_rows_remote=32, send_rows=64, send_rows_remote=32,
                                  rdma_pairs=64, rdma_pairs_remote=0) for r in range(2))  # fmt: skip
            ops = tuple(op_result(OpMeasurement(op=op, samples_us=[[100.0] * 5] * 2, bytes_per_row=2048), rows)
                        for op in ("dispatch", "combine", "roundtrip"))  # fmt: skip
            files.append_result(
                CaseRecord(case=case, status="ok", world=2, gpus_per_node=2, rows=rows, ops=ops)
            )
    rd.set_status("complete")
    con = connect(db_path)
    try:
        ingest(con, rd.path)
        for (dtype, op), gbps in MOELAB_NVL.items():
            case_id = con.execute(
                "SELECT case_id FROM cases WHERE run_id = ? AND dtype = ?", [spec.run_id, dtype]
            ).fetchone()[0]  # type: ignore[index]
            con.execute("DELETE FROM bandwidths WHERE run_id = ? AND case_id = ? AND op = ? AND definition = 'deepep_nvl'",
                        [spec.run_id, case_id, op])  # fmt: skip
            con.execute(
                "INSERT INTO bandwidths VALUES (?, 'deepep', ?, ?, 'deepep_nvl', 0, 0, ?)",
                [spec.run_id, case_id, op, gbps],
            )
    finally:
        con.close()
    job = JobOutcome(
        backend="deepep", argv=[], returncode=0, signal=None, timed_out=False, duration_s=1.0, started_at=""
    )
    return RunOutcome(spec.run_id, rd.path, {"deepep": job}, True)


@pytest.fixture
def deepep_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tree = tmp_path / "DeepEP"
    (tree / "tests").mkdir(parents=True)
    shutil.copy(FIX / "fake_test_intranode.py", tree / "tests" / "test_intranode.py")
    monkeypatch.setattr(measure, "check_available", lambda *a: None)  # deep_ep cannot be imported on CPU
    monkeypatch.setattr(measure, "run_moelab", _fake_measure)
    return tree


def _library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **figures: Any) -> None:
    (tmp_path / "fake_deepep.json").write_text(json.dumps(figures))
    monkeypatch.setenv("FAKE_DEEPEP", str(tmp_path / "fake_deepep.json"))


def test_deepep_default_chunk_lines_compared(
    tmp_path: Path, deepep_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _library(tmp_path, monkeypatch, fp8=231.0, bf16=340.0, combine=400.0)
    res = runner.invoke(
        app,
        _args(tmp_path, "--hidden", "7168", "--backend", "deepep", "--backend-path", f"deepep={deepep_tree}"),
    )
    assert res.exit_code == 1, res.output  # combine is off by 30%: a finding
    rows = {(r[1], r[2]): r for r in _stored(tmp_path)}
    assert set(rows) == {("dispatch", "bf16"), ("dispatch", "fp8"), ("combine", "bf16")}
    # the default-chunk figures, not the tuned chunk 8 / Best lines (1.1x)
    assert rows[("dispatch", "fp8")][4:8] == (231.0, 230.0, pytest.approx(230 / 231), "pass")
    assert rows[("dispatch", "bf16")][4:8] == (340.0, 330.0, pytest.approx(330 / 340), "pass")
    assert rows[("combine", "bf16")][4:8] == (400.0, 280.0, pytest.approx(0.7), "fail")
    log = next((tmp_path / "runs").iterdir()) / rows[("combine", "bf16")][8]
    assert (
        "test_intranode.py --num-processes 2 --num-tokens 64 --hidden 7168 --num-topk 8 --num-experts 16"
        in log.read_text()
    )
    # a wider tolerance passes the same figures
    res = runner.invoke(app, _args(tmp_path, "--hidden", "7168", "--backend", "deepep", "--backend-path",
                                   f"deepep={deepep_tree}", "--tolerance", "0.35"))  # fmt: skip
    assert res.exit_code == 0, res.output


def test_deepep_library_test_failing(
    tmp_path: Path, deepep_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _library(tmp_path, monkeypatch, fp8=230.0, bf16=330.0, combine=280.0, die_after_fp8=True)
    res = runner.invoke(
        app,
        _args(tmp_path, "--hidden", "7168", "--backend", "deepep", "--backend-path", f"deepep={deepep_tree}"),
    )
    assert res.exit_code == 1, res.output
    rows = {(r[1], r[2]): r for r in _stored(tmp_path)}
    assert rows[("dispatch", "fp8")][7] == "pass" and "exit code 1" in rows[("dispatch", "fp8")][9]
    for key in (("dispatch", "bf16"), ("combine", "bf16")):
        assert rows[key][7] == "error" and rows[key][4] is None
        assert (
            "printed no" in rows[key][9] and "illegal memory access" in rows[key][9]
        )  # the log's last lines
    assert "illegal memory access" in res.output


def test_deepep_unsupported_hidden_runs_no_library_test(
    tmp_path: Path, deepep_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _library(tmp_path, monkeypatch, fp8=230.0, bf16=330.0, combine=280.0)
    res = runner.invoke(
        app,
        _args(tmp_path, "--hidden", "8192", "--backend", "deepep", "--backend-path", f"deepep={deepep_tree}"),
    )
    assert res.exit_code == 0, res.output  # nothing mismatched: the configuration is recorded as unsupported
    rows = _stored(tmp_path)
    assert {r[7] for r in rows} == {"unsupported"} and all("DeepEP#722" in r[9] for r in rows)
    assert not (next((tmp_path / "runs").iterdir()) / "verify" / "deepep_test_intranode.log").exists()


def test_a_library_that_cannot_run_the_configuration_gets_no_moelab_job_beside_one_that_can(
    tmp_path: Path, deepep_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepEP V1 cannot run hidden 8192: moelab's side of it would be compared with nothing (on 2 x H200 it
    was a 16 s job of the acceptance run's verify). Beside nccl-tests, which can, only nccl-tests is
    measured; DeepEP's rows are stored unsupported with the reason."""
    exe = _fake_binary(tmp_path, [200.0], monkeypatch)
    _library(tmp_path, monkeypatch, fp8=230.0, bf16=330.0, combine=280.0)
    measured: list[tuple[str, ...]] = []

    def record(spec: RunSpec, *args: Any) -> RunOutcome:
        measured.append(spec.backends)
        return _fake_measure(spec, *args)

    monkeypatch.setattr(measure, "run_moelab", record)
    res = runner.invoke(app, _args(tmp_path, "--hidden", "8192", "--backend", "deepep,nccl-tests",
                                   "--backend-path", f"deepep={deepep_tree}", "--nccl-tests-bin", str(exe)))  # fmt: skip
    assert measured == [("nccl-tests",)], res.output
    rows = _stored(tmp_path)
    deepep = [r for r in rows if r[0] == "deepep"]
    assert deepep and {r[7] for r in deepep} == {"unsupported"} and all("DeepEP#722" in r[9] for r in deepep)
    assert {r[0] for r in rows} == {"deepep", "nccl-tests"}
    dry = runner.invoke(app, _args(tmp_path, "--hidden", "8192", "--backend", "deepep,nccl-tests", "--backend-path",
                                   f"deepep={deepep_tree}", "--nccl-tests-bin", str(exe), "--dry-run"))  # fmt: skip
    assert "# moelab deepep" not in dry.output and "# deepep: not run" in dry.output, dry.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--backend", "uccl"], "verify knows no backend 'uccl'"),
        (["--backend", "deepep", "--sms", "16"], "runs 24 SMs only"),
        (["--backend", "hybrid-ep", "--dtype", "mxfp8"], "verify compares payloads"),
        (["--backend", "deepep"], "--backend-path deepep=DIR"),
        (["--backend", "nccl-tests", "--hidden", "8192,4096"], "one whole number"),
        (["--backend", "nccl-tests", "--tolerance", "2"], "--tolerance must be within"),
        (["--backend", "deepep", "--backend-path", "deepep=/nonexistent"], "is not a directory"),
    ],
)
def test_bad_input(tmp_path: Path, extra: list[str], message: str) -> None:
    res = runner.invoke(app, _args(tmp_path, *extra))
    assert res.exit_code == 2, res.output
    assert "error: " in res.output and message in res.output
    assert not (tmp_path / "m.duckdb").exists()


def test_backend_path_without_the_test(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    res = runner.invoke(
        app, _args(tmp_path, "--backend", "hybrid-ep", "--backend-path", f"hybrid-ep={tmp_path / 'tree'}")
    )
    assert res.exit_code == 2 and "tests/test_hybrid_ep.py not found" in res.output


def test_dry_run_prints_cases_and_library_commands(tmp_path: Path) -> None:
    tree = tmp_path / "DeepEP"
    (tree / "tests").mkdir(parents=True)
    res = runner.invoke(app, _args(tmp_path, "--dry-run", "--backend", "deepep,hybrid-ep,nccl-tests", "--hidden", "7168",
                                   "--backend-path", f"deepep={tree}", "--nccl-tests-bin", str(tmp_path)))  # fmt: skip
    assert res.exit_code == 0, res.output
    out = res.output
    assert "# moelab deepep: case h7168-t64-k8-e8-uniform-s0-bf16-sm24" in out
    assert (
        f"cd {tree}/tests && " in out
        and "test_intranode.py --num-processes 2 --num-tokens 64 --hidden 7168" in out
    )
    assert "# hybrid-ep: needs --backend-path hybrid-ep=DIR" in out
    assert f"{tmp_path}/alltoall_perf -b " in out and not (tmp_path / "m.duckdb").exists()
    res = runner.invoke(
        app,
        _args(
            tmp_path,
            "--dry-run",
            "--backend",
            "deepep",
            "--hidden",
            "8192",
            "--backend-path",
            f"deepep={tree}",
        ),
    )
    assert res.exit_code == 0 and "# deepep: not run: tests/test_intranode.py cannot run" in res.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--label", "\x1b[31mRED"], "holds control characters"),
        (["--gpus", "0"], "--gpus must be > 0"),
        (["--iters", "0"], "--iters must be > 0"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--timeout", "-1"], "--timeout must be > 0"),
        (["--library-timeout", "0"], "--library-timeout must be > 0"),
        (["--library-timeout", "nan"], "--library-timeout must be a finite number"),  # nan <= 0 is False
        (["--library-timeout", "1e300"], "--library-timeout 1e+300 is above the largest"),
        (["--library-timeout", "0.1"], "--library-timeout 0.1 is below the least this moelab waits"),
        (["--backend", "nccl-tests,nccl-tests"], "names nccl-tests more than once"),
        (["--tokens-per-rank", "2097152"], "tokens-per-rank 2097152 is above"),
        (["--topk", "9", "--experts-per-rank", "2"], "topk 9 > total experts 4"),
    ],
)
def test_bad_flags_get_the_planners_one_line_error(tmp_path: Path, extra: list[str], message: str) -> None:
    """verify plans its run with plan_run: a flag `moelab run` refuses is refused here too, before anything
    runs (also under --dry-run, which prints nothing then)."""
    for dry in ([], ["--dry-run"]):
        res = runner.invoke(app, _args(tmp_path, *with_flags(["--backend", "nccl-tests"], *dry, *extra)))
        assert res.exit_code == 2, res.output
        assert res.stderr.startswith("error: ") and message in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "# moelab" not in res.stdout
        assert not (tmp_path / "m.duckdb").exists() and not (tmp_path / "runs").exists()


def test_dry_run_plan_is_the_same_through_the_planner(tmp_path: Path) -> None:
    """Each backend's cases, in order, with the ids, SMs and knobs verify planned before it used plan_run."""
    res = runner.invoke(app, _args(tmp_path, "--dry-run", "--backend", "deepep,hybrid-ep,nccl-tests,deepep-ll",
                                   "--hidden", "7168", "--nccl-tests-bin", str(tmp_path)))  # fmt: skip
    assert res.exit_code == 0, res.output
    knobs = {"deepep": library_way_knobs("deepep"), "hybrid-ep": library_way_knobs("hybrid-ep")}
    want = [(b, f"h7168-t64-k8-e8-uniform-s0-{d}-sm{s}", s if s != "def" else "default", knobs.get(b, {}))
            for b, d, s in (("deepep", "bf16", 24), ("deepep", "fp8", 24), ("hybrid-ep", "bf16", "def"),
                            ("hybrid-ep", "fp8", "def"), ("nccl-tests", "bf16", "def"), ("nccl-tests", "fp8", "def"),
                            ("deepep-ll", "fp8", "def"))]  # fmt: skip
    lines = [line for line in res.stdout.splitlines() if line.startswith("# moelab ")]
    assert lines == [f"# moelab {b}: case {c} sms={s} knobs={k}" for b, c, s, k in want]


def test_ctrl_c_in_moelabs_run_runs_no_library_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C stopped moelab's job, then verify went on to run each library's benchmark as if nothing had
    happened (each up to --library-timeout). It now stops there: moelab's run stored as interrupted, exit 130."""
    from moelab.cli import verify_cmd

    exe = _fake_binary(tmp_path, [200.0], monkeypatch)
    real = measure.run_moelab

    def interrupted(spec: RunSpec, runs_root: Path, db_path: Path, progress: Any) -> RunOutcome:
        def tell(line: str) -> None:
            progress(line)
            if " cases on " in line:  # moelab's job is starting: the user presses Ctrl-C
                os.kill(os.getpid(), signal.SIGINT)

        return real(spec, runs_root, db_path, tell)

    def no_library(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a library benchmark ran after Ctrl-C")

    monkeypatch.setattr(measure, "run_moelab", interrupted)
    monkeypatch.setattr(verify_cmd, "verify_backend", no_library)
    res = runner.invoke(
        app, _args(tmp_path, "--backend", "nccl-tests", "--nccl-tests-bin", str(exe), "--dtype", "bf16")
    )
    assert res.exit_code == 130, res.output
    assert "was interrupted (SIGINT): finished cases stored" in res.stdout
    con = connect(tmp_path / "m.duckdb", read_only=True)
    try:
        assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    finally:
        con.close()
