"""`.ci/run` stops the SLURM daemons it started: its EXIT trap runs .ci/slurm-stop.sh, which stops each
daemon by its pid file and waits for it. Shown here on stand-in daemons (the real ones need root and apt)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a stopped child not yet reaped is a zombie: gone for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_stop_script_stops_every_daemon_by_its_pid_file(tmp_path: Path) -> None:
    daemons = [
        subprocess.Popen(["sleep", "300"]),  # stops on TERM
        subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 300 & wait"]),  # ignores TERM: killed
    ]
    files = []
    for i, p in enumerate(daemons):
        f = tmp_path / f"d{i}.pid"
        f.write_text(f"{p.pid}\n")
        files.append(str(f))
    files.append(str(tmp_path / "never-started.pid"))
    time.sleep(0.2)
    r = subprocess.run(
        ["bash", str(ROOT / ".ci" / "slurm-stop.sh"), *files], capture_output=True, text=True, timeout=60
    )
    for p in daemons:
        p.poll()
    assert r.returncode == 0, r.stderr
    assert not any(_alive(p.pid) for p in daemons)
    assert r.stdout.count("stopped pid") == 2


def test_ci_run_traps_exit_before_starting_slurm() -> None:
    """The trap is set before the daemons start, so a failure anywhere after (lint, a test) stops them too."""
    text = (ROOT / ".ci" / "run").read_text()
    assert text.index("trap 'bash .ci/slurm-stop.sh' EXIT") < text.index("bash .ci/slurm-setup.sh")
    stop_defaults = (ROOT / ".ci" / "slurm-stop.sh").read_text()
    setup = (ROOT / ".ci" / "slurm-setup.sh").read_text()
    for pidfile in ("/run/slurmctld.pid", "/run/slurmd.pid"):
        assert pidfile in setup and pidfile in stop_defaults
