"""Run one library benchmark as a subprocess in its own session, bounded in wall time, its output kept."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from moelab.backends.library_test import LibraryCommand

TAIL_LINES = 15


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryRun:
    command: LibraryCommand
    log_path: Path
    text: str  # stdout and stderr, interleaved as written
    returncode: int | None  # None: killed at the timeout
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        if self.timed_out:
            return f"timed out after {self.duration_s:.0f} s"
        if self.returncode is None or self.returncode == 0:
            return "ok"
        if self.returncode < 0:
            return f"killed by signal {signal.Signals(-self.returncode).name}"
        return f"exit code {self.returncode}"

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.text.rstrip().splitlines()[-lines:])


def run_library(command: LibraryCommand, log_dir: Path, timeout_s: float) -> LibraryRun:
    """Run `command`; its whole process session is killed at `timeout_s` (its spawned ranks included)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / command.log_name
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        log.write(f"# {command.shell_line()}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                list(command.argv),
                cwd=command.cwd,
                env={**os.environ, **command.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            log.write(f"cannot start: {exc}\n")
            return LibraryRun(
                command=command,
                log_path=log_path,
                text=f"cannot start: {exc}\n",
                returncode=127,
                timed_out=False,
                duration_s=0.0,
            )
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_session(proc)
            returncode = None
    text = log_path.read_text(encoding="utf-8", errors="replace").split("\n", 1)[1]
    return LibraryRun(
        command=command,
        log_path=log_path,
        text=text,
        returncode=returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - t0,
    )


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
