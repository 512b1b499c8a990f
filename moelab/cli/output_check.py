"""An output file a command writes after its measuring (`--report`, `--suite-out`), checked before: a path
that cannot be written was found only after every measurement had run."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from moelab.core.errors import MoelabError


def check_output_file(path: Path, flag: str) -> None:
    """One MoelabError line unless `path` can be written as the command will write it (its missing folders
    made first): an existing file opened for appending, else a scratch file made and removed in the
    nearest existing folder above it."""
    path = path.expanduser()
    if path.is_dir():
        raise MoelabError(f"{flag} {path} is a folder: give a file name")
    try:
        if path.exists():
            with path.open("ab"):
                return
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise MoelabError(f"{flag} {path}: {folder} is not a folder")
        fd, scratch = tempfile.mkstemp(dir=folder, prefix=".moelab-write-check-")
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(scratch)
    except OSError as exc:
        raise MoelabError(
            f"{flag} {path} cannot be written ({exc.strerror or exc}): nothing was run"
        ) from None
