"""Where a run directory is now: an open descriptor of the folder follows it when it is moved mid-run. The
runner checks before each job and before storing; a moved folder's old path was re-created by the next
job (without spec.json) and the advice named that old path."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class RunDirAnchor:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self._inode = os.fstat(self._fd).st_ino

    def moved_to(self) -> Path | None:
        """None while the folder is at its path; else where it is now (deleted: `(deleted)` in the name)."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                return None
        try:
            return Path(os.readlink(f"/proc/self/fd/{self._fd}"))
        except OSError:
            return Path("(unknown: moved or deleted)")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
