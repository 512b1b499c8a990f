"""A rank's process groups end, threads and all, before the interpreter shuts down (moelab.measure.teardown).

A gloo group still held at shutdown is torn down in finalization, which aborted a rank now and then after
every case was stored (SIGABRT, "terminate called without an active exception") and failed the job.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from moelab.cli.main import app
from tests.distributed_helpers import groups_left

ROOT = Path(__file__).resolve().parents[2]

# gloo starts its run-loop threads lazily: wait (10 s at most) until one is up, so what the test reads next
# does not depend on how far the start got (neither was up in 1 run of 30). Imports no moelab module, so a
# body can still import moelab.measure.teardown after it.
_UNTIL_GLOO_RUNS = """
import pathlib, time
def _gloo_up():
    for t in pathlib.Path("/proc/self/task").iterdir():
        try:
            if "gloo" in (t / "comm").read_text():
                return True
        except OSError:
            pass  # a thread that ended while being listed
    return False
for _ in range(200):
    if _gloo_up():
        break
    time.sleep(0.05)
"""
_ONE_RANK = (
    """
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
"""
    + _UNTIL_GLOO_RUNS
)


def _in_fresh_process(body: str) -> str:
    """Run `body` in a new interpreter (groups and imports of its own); returns its stdout."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_released_group_leaves_no_thread_and_a_held_one_is_named() -> None:
    out = _in_fresh_process(
        "from moelab.measure.teardown import communicator_threads, release_process_groups\n"
        + _ONE_RANK
        + """
import torch.distributed as dist
print("running", communicator_threads())
print("released", release_process_groups())
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
holder = [dist.group.WORLD]
"""
        + _UNTIL_GLOO_RUNS
        + """
print("held", release_process_groups())
"""
    )
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    # gloo's run-loop threads are pt_gloo_runloop and gloo_tcp_loop; which of them is up yet is a race
    assert "gloo" in lines["running"]
    assert lines["released"] == "[]"
    assert "gloo" in lines["held"]  # what the rank log's teardown line names


def test_torchs_functional_defaults_hold_no_group_once_teardown_is_imported() -> None:
    """torch.distributed.nn.functional captures group.WORLD in its defaults at import: imported after the
    group exists (torchao's import does that), it keeps the group alive into finalization."""
    late = _in_fresh_process(
        _ONE_RANK
        + """
import torch.distributed.nn.functional
from moelab.measure.teardown import release_process_groups
print(release_process_groups())
"""
    )
    assert "gloo" in late  # the mechanism: without the early import the group outlives destroy
    early = _in_fresh_process(
        "import moelab.measure.teardown\n"
        + _ONE_RANK
        + """
import torch.distributed.nn.functional
from moelab.measure.teardown import release_process_groups
print(release_process_groups())
"""
    )
    assert early.strip() == "[]"


def test_every_rank_of_moelab_run_ends_its_groups_before_exit(tmp_path: Path) -> None:
    """Both orders: mxfp8-a2a's job (which imports torchao after its group exists) kept its group whether
    it ran first or second; the CI failure was its rank aborting at exit."""
    for order in ("mxfp8-a2a,nccl-a2a", "nccl-a2a,mxfp8-a2a"):
        run_id = "teardown-" + order.split(",")[0]
        args = ["run", "--cpu", "--backend", order, "--sms", "default", "--tokens-per-rank", "64"]
        args += ["--iters", "2", "--warmup", "0", "--no-health", "--quiet"]
        args += ["--run-id", run_id, "--out", str(tmp_path / "runs"), "--db", str(tmp_path / "m.duckdb")]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert len(list((tmp_path / "runs" / run_id).glob("*/rank*.log"))) == 4
        assert groups_left(tmp_path / "runs" / run_id) == {}
