"""Reading the files of a run directory as data, never as a path to somewhere else.

A run directory is written by moelab's own processes, but it is read back later (`moelab ingest` of an
abandoned directory, one copied from another node), when anything may have replaced its files: a
symbolic link to another file or to `/dev/zero`, a FIFO, a file of gigabytes. Every reader here opens
the file itself (O_NOFOLLOW: a link is refused, not followed), only a regular file (a FIFO or a device
is refused without blocking on it), and reads at most a cap (a log's tail, a JSON file up to its cap).
Each refusal is a `RunDirFileError`: one line naming the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from moelab.core.errors import MoelabError

MAX_JSON_BYTES = 256 << 20  # spec.json of a large suite is some MB; nothing moelab writes comes near
MAX_LINE_BYTES = 512 << 20  # one results.jsonl record (every raw sample of every rank of one case)
TAIL_BYTES = 256 << 10  # what is read of a log: its last lines, never the whole of a chatty rank's output
_CHUNK = 1 << 20


class RunDirFileError(MoelabError):
    """A file of a run directory that cannot be read as moelab wrote it (one line naming the file)."""


def open_plain(path: Path) -> int | None:
    """A read-only descriptor of the regular file `path` itself, or None when there is none.

    A symbolic link (even a dangling one) is refused rather than followed, and a FIFO or a device is
    refused without blocking on it (O_NONBLOCK, then fstat)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunDirFileError(
                f"{path} is a symbolic link: moelab reads the file itself, not what a link points to"
            ) from None
        raise RunDirFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunDirFileError(f"{path} is not a regular file")
    return fd


def read_capped(path: Path, cap: int = MAX_JSON_BYTES) -> bytes | None:
    """The whole file, refused when it is larger than `cap`; None when it does not exist."""
    fd = open_plain(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        too_big = os.fstat(fh.fileno()).st_size > cap  # refused before reading it
        data = b"" if too_big else fh.read(cap + 1)  # and a file that grows while read stops at the cap
    if too_big or len(data) > cap:
        raise RunDirFileError(f"{path} is larger than {cap >> 20} MiB: not a file moelab wrote")
    return data


def read_tail(path: Path, cap: int = TAIL_BYTES) -> bytes | None:
    """At most the last `cap` bytes of the file (the rest stays on disk); None when it does not exist."""
    fd = open_plain(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > cap:
            fh.seek(size - cap)
        return fh.read(cap)


def tail_text(path: Path, lines: int, cap: int = TAIL_BYTES) -> str | None:
    """The last `lines` lines of a log (bytes that are not UTF-8 replaced), read through `read_tail`;
    None when the file is missing or is not a plain file (a link is not followed)."""
    try:
        data = read_tail(path, cap)
    except RunDirFileError:
        return None
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:])


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunDirFileError(
            f"{where}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from None


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirFileError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise RunDirFileError(f"{where}: JSON nested too deeply") from None


def read_json(path: Path, cap: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in `path` (None when the file does not exist), or a RunDirFileError."""
    data = read_capped(path, cap)
    if data is None:
        return None
    return parse_json(decode_utf8(data, str(path)), str(path))


def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """`value` when it has the JSON shape a reader needs (a dict, a list), else a RunDirFileError."""
    if not isinstance(value, kind):
        names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
        want = " or ".join(names.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise RunDirFileError(f"{where}: expected {want}, found {type(value).__name__}")
    return value


def iter_lines(path: Path, max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """(line number from 1, its bytes without the newline, whether it ended with a newline) for each line
    of a JSON-lines file, streamed; a line longer than `max_line` is given as its first `max_line`
    bytes, marked unterminated, and the rest of it skipped. Nothing when the file does not exist."""
    fd = open_plain(path)
    if fd is None:
        return
    with os.fdopen(fd, "rb", buffering=_CHUNK) as fh:
        number = 0
        while True:
            line = fh.readline(max_line + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line and not line.endswith(b"\n"):
                while (rest := fh.readline(_CHUNK)) and not rest.endswith(b"\n"):
                    pass
                yield number, line[:max_line], False
                continue
            ended = line.endswith(b"\n")
            yield number, line.rstrip(b"\r\n"), ended
