"""A run directory whose launcher died (kill -9, a lost node, a closed terminal) made readable for ingest.

run.json says `running` with the launching pid, host and pid start time (RunDir.create). When that
process is gone, the run is marked `interrupted`, and each backend job that had started but never wrote
its job.json (its launcher died before it could) gets one saying so, with the ranks' last log lines;
every case the job had finished is in its results.jsonl and is stored as measured.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal

from moelab.job.rundir import RunDir, now_iso, process_start

LauncherState = Literal["alive", "gone", "unknown"]


def launcher_state(info: dict[str, Any]) -> LauncherState:
    """Is the process that launched this run still there? `unknown` for another host's run (or a run
    directory older than the pid record): this host cannot tell."""
    pid, host = info.get("pid"), info.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return "unknown"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # exists, owned by someone else
    started = info.get("pid_start")
    now = process_start(pid)
    if started is not None and now is not None and now != started:
        return "gone"  # the pid now names another process
    return "alive"


def mark_abandoned(rd: RunDir, reason: str) -> list[str]:
    """Write what the dead launcher could not: a job.json for every job it had started, and the run's
    status `interrupted`. Returns the backends whose job.json this wrote."""
    written = []
    for files in (f for backend in rd.spec.backends for f in rd.starts(backend)):
        backend = files.backend
        if not files.dir.is_dir() or files.read_job() is not None:
            continue
        files.write_job(
            {
                "backend": backend,
                "argv": [],
                "returncode": None,
                "signal": None,
                "timed_out": False,
                "duration_s": None,
                "started_at": None,
                "failed_ranks": [],
                "stderr_tails": files.log_tails(),
                "leftover_pids": [],
                "interrupted": "launcher died",
                "description": f"job did not finish: {reason}",
            }
        )
        written.append(backend if files.repeat == 0 else f"{backend} r{files.repeat}")
    rd.set_status("interrupted", reason=reason, recovered_at=now_iso())
    return written
