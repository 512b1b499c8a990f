"""A real srun step on a single-host SLURM cluster (slurmctld + slurmd on localhost), 2 gloo ranks.

Skipped unless `srun` is on PATH and the controller answers with a usable node. Setup on Debian 12
(as root; .ci/run): see containers/README.md, "A one-host SLURM cluster for CI".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.job.launchers import LaunchPlan, srun_argv

ROOT = Path(__file__).resolve().parent.parent.parent


def _cluster_ready() -> bool:
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and any(s.strip("*~#") in ("idle", "mixed") for s in out.stdout.split())


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _cluster_ready(), reason="no reachable SLURM controller with an idle node"),
]


def test_srun_two_ranks_join_through_slurm_variables(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    plan = LaunchPlan(
        launcher="slurm",
        nodes=1,
        gpus_per_node=2,
        device="cpu",
        python=sys.executable,
        worker_module="tests._slurm_probe",
        worker_args=(str(out),),
        env={"PYTHONPATH": str(ROOT)},
    )
    argv = srun_argv(plan)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["gathered"] == [0, 11]  # rank*10 + local rank, from SLURM_PROCID / SLURM_LOCALID
    assert data["env"]["WORLD_SIZE"] == "2" and data["env"]["LOCAL_WORLD_SIZE"] == "2"
    hosts = subprocess.run(
        ["sinfo", "-h", "-o", "%n"], capture_output=True, text=True, timeout=10
    ).stdout.split()
    assert data["env"]["MASTER_ADDR"] in hosts
