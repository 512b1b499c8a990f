"""Names a user gives (run ids, labels): checked before any directory is made or anything is stored."""

from __future__ import annotations

import re

from moelab.errors import SpecError

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def validate_run_id(run_id: str) -> str:
    """A run id becomes a folder name: letters, digits, '.', '_' and '-', no path separator, no '..'."""
    if not RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise SpecError(
            f"--run-id {run_id!r} is not a valid run id: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'"
        )
    return run_id


def validate_label(label: str) -> str:
    """A label is printed to terminals and reports: no control characters, not empty, at most 200 characters."""
    if not label.strip() or len(label) > 200 or CONTROL.search(label):
        raise SpecError(f"label {label!r} must be 1-200 printable characters with no control characters")
    return label
