"""One rank of one backend job: `python -m moelab.measure.worker RUN_DIR BACKEND [REPEAT]`, started by a launcher.

The parent-death signal is armed before anything heavy is imported: `import torch` takes seconds, and a
rank whose launcher dies (or that is stopped) in that time must not run on alone. The rank's work is in
moelab.measure.rank; a rank that dies of an exception leaves RUN_DIR/BACKEND/rank<R>.error.json.
"""

from __future__ import annotations

import os
import sys
import traceback

from moelab.job.lifeline import die_with_parent


def main(argv: list[str]) -> int:
    from moelab.measure.rank import main as run_rank

    return run_rank(argv)


if __name__ == "__main__":
    die_with_parent()  # first: if the launcher (torchrun) is killed, this rank must not run on alone
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException as exc:
        from moelab.job.diagnosis import record_worker_error

        traceback.print_exc()
        record_worker_error(sys.argv[1:], exc)  # RUN_DIR/BACKEND[/r<K>]/rank<R>.error.json
        sys.stderr.flush()
        os._exit(1)  # skip interpreter teardown: a wedged process group must not hang the exit
