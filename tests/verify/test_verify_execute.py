"""Running a library benchmark: output kept with the command line, non-zero exits and timeouts as results,
the whole process session (the test's spawned ranks) killed at the timeout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from moelab.backends.library_test import LibraryCommand
from moelab.verify.execute import run_library


def _cmd(code: str, **kw: object) -> LibraryCommand:
    return LibraryCommand(
        library="deepep", test="tests/test_intranode.py", argv=(sys.executable, "-c", code), **kw
    )  # type: ignore[arg-type]


def test_output_and_exit_code(tmp_path: Path) -> None:
    run = run_library(_cmd("import sys; print('[tuning] a'); print('boom', file=sys.stderr); sys.exit(3)",
                           env={"X_VERIFY": "1"}, log_name="t.log"), tmp_path / "verify", 30)  # fmt: skip
    assert (run.returncode, run.timed_out, run.ok, run.describe()) == (3, False, False, "exit code 3")
    assert run.text == "[tuning] a\nboom\n" and run.tail(1) == "boom"
    assert (
        run.log_path.read_text().startswith("# X_VERIFY=1 ") and run.log_path == tmp_path / "verify" / "t.log"
    )


def test_environment_and_cwd(tmp_path: Path) -> None:
    run = run_library(_cmd("import os; print(os.getcwd(), os.environ['X_VERIFY'])", env={"X_VERIFY": "7"}, cwd=str(tmp_path)),
                      tmp_path / "v", 30)  # fmt: skip
    assert run.ok and run.text.strip() == f"{tmp_path} 7"


@pytest.mark.slow
def test_timeout_kills_the_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")  # fmt: skip
    t0 = time.monotonic()
    run = run_library(_cmd(code), tmp_path / "v", 2)
    assert run.timed_out and run.returncode is None and run.describe().startswith("timed out")
    assert time.monotonic() - t0 < 20 and "started" in run.text
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"child {child} of the library test survived the timeout")


def test_missing_program(tmp_path: Path) -> None:
    run = run_library(
        LibraryCommand(library="nccl-tests", test="alltoall_perf", argv=(str(tmp_path / "nope"),)),
        tmp_path,
        5,
    )
    assert run.returncode == 127 and "cannot start" in run.text
