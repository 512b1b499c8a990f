"""Each rank's heartbeat: a file whose modification time a daemon thread renews every BEAT_S while the rank
lives. When a job fails, the rank whose heartbeat ended first is the one that stopped (SIGSTOP freezes
its threads too), exited mid-dispatch or died without a record; the others only timed out waiting for
it, and a headline that named their timeout blamed the wrong rank."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

BEAT_S = 1.0
# a rank is the first to stop when its heartbeat ended this long before the next one's
SILENT_BEFORE_S = 5 * BEAT_S


def start_heartbeat(path: Path, beat_s: float = BEAT_S) -> threading.Event:
    """Renew `path` every `beat_s` from a daemon thread; set the returned event to stop."""
    stop = threading.Event()
    path.touch()

    def beat() -> None:
        while not stop.wait(beat_s):
            with contextlib.suppress(OSError):
                os.utime(path)

    threading.Thread(target=beat, name="moelab-heartbeat", daemon=True).start()
    return stop


def first_silent(last_beats: dict[int, float]) -> tuple[int, float] | None:
    """(rank, seconds) when one rank's heartbeat ended at least SILENT_BEFORE_S before every other rank's:
    that rank and how long before the next one; None when no rank stands out (or fewer than two beat)."""
    if len(last_beats) < 2:
        return None
    (first, at), (_, next_at) = sorted(last_beats.items(), key=lambda kv: kv[1])[:2]
    gap = next_at - at
    return (first, gap) if gap >= SILENT_BEFORE_S else None
