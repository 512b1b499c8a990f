"""An output file a command writes after its measuring (`--report`, `--suite-out`), checked before: a path
that cannot be written was found only after every measurement had run."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from moelab.core.errors import MoelabError
from moelab.store.db import wal_path


def check_outputs(
    db_path: Path,
    outputs: Mapping[str, Path | str | None],
    inputs: Mapping[str, Path | str | None] | None = None,
) -> None:
    """One MoelabError line when an output file (flag: path) is the database or its write-ahead log (a
    report written there replaced the store, a summary appended to it corrupted it, every run lost), a
    file the command reads (`run --suite s.toml --report s.toml` replaced the user's suite with HTML), or
    another output (`check --summary x --junit x`: one overwrote the other)."""
    store = (db_path.expanduser(), wal_path(db_path.expanduser()))
    given = {flag: Path(out).expanduser() for flag, out in outputs.items() if out is not None}
    read = {flag: Path(p).expanduser() for flag, p in (inputs or {}).items() if p is not None}
    for n, (flag, out) in enumerate(given.items()):
        if any(_same_file(out, s) for s in store):
            raise MoelabError(
                f"{flag} {out} is the database (--db {db_path}): writing it would destroy every run"
            )
        for in_flag, path in read.items():
            if path.is_file() and _same_file(out, path):
                raise MoelabError(f"{flag} {out} is the file {in_flag} reads: writing it would replace it")
        for other_flag, other in list(given.items())[n + 1 :]:
            if _same_file(out, other):
                raise MoelabError(f"{flag} and {other_flag} name one file, {out}: give each its own")


def _same_file(a: Path, b: Path) -> bool:
    """The same file by its inode (a hard link, a symlink), or by its absolute path where one is missing."""
    try:
        return os.path.samefile(a, b) if a.exists() and b.exists() else a.resolve() == b.resolve()
    except OSError:
        return False


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
