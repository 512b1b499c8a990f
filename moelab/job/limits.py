"""The open-file limit a job needs. Under `ulimit -n 12` the launcher and its ranks could not open their
sockets and logs: the job hung for the whole --timeout and was recorded as timed out with no cause."""

from __future__ import annotations

import resource

from moelab.core.errors import MoelabError

MIN_OPEN_FILES = 256  # torchrun, gloo/NCCL sockets and each rank's logs, with room to spare
WANT_OPEN_FILES = 4096


def ensure_open_files(minimum: int = MIN_OPEN_FILES) -> None:
    """Raise the soft open-file limit towards WANT_OPEN_FILES where the hard limit allows (children inherit
    it); one MoelabError line when even the hard limit is below `minimum`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft >= WANT_OPEN_FILES:
        return
    target = WANT_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, WANT_OPEN_FILES)
    if soft == resource.RLIM_INFINITY or target <= soft:
        target = soft
    else:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    if target != resource.RLIM_INFINITY and target < minimum:
        raise MoelabError(
            f"the open-file limit is {target} (ulimit -n; hard limit {hard}): a job needs at least {minimum} "
            f"for its launcher, sockets and logs; raise it (ulimit -n {WANT_OPEN_FILES}) and run again"
        )
