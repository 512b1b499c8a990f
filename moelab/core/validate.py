"""Checks of user input and of a run's outcome that decide an exit code: pure functions, no I/O.

Each refusal is a `SpecError` with one line, raised before any directory is made or anything runs.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from moelab.core.errors import SpecError

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LABEL_MAX = 200

# a case in one of these states was never timed (nothing wrong with the run, nothing measured either)
NOT_MEASURED = frozenset({"unsupported", "skipped"})


def nothing_measured(statuses: Iterable[str]) -> str | None:
    """The reason line when no case of a run was measured because every one is unsupported or skipped;
    None when at least one case ran (ok, or failed, which has its own exit code) or there are none."""
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    if not counts or set(counts) - NOT_MEASURED:
        return None
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return f"nothing was measured: every case is unsupported or skipped ({parts}); --allow-empty accepts that"


def dedupe_backends(names: Sequence[str]) -> list[str]:
    """`names` as given, or a SpecError naming each backend given more than once: a backend runs once per
    run (its cases are keyed by run, backend and case), so a repeat is a typo, refused before anything runs."""
    seen: list[str] = []
    repeated: list[str] = []
    for name in names:
        if name not in seen:
            seen.append(name)
        elif name not in repeated:
            repeated.append(name)
    if repeated:
        raise SpecError(f"--backend names {', '.join(repeated)} more than once: give each backend once")
    return seen


def validate_run_id(run_id: str) -> str:
    """A run id is a folder name under --out and a key in the database: letters, digits, `.`, `_`, `-`,
    starting with a letter or digit, at most 128 characters (so no path separator and no `..` alone)."""
    if not RUN_ID_RE.match(run_id) or ".." in run_id:
        raise SpecError(
            f"--run-id {shown(run_id)!r} is not a plain name: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, no '..', at most 128 characters)"
        )
    return run_id


def plain_name_problem(name: str, what: str) -> str | None:
    """Why `name` cannot name a backend (a folder under the run directory, a word on every progress line), or
    None: the same rule as a run id (letters, digits, `.`, `_`, `-`; no path separator, no `..`, no
    control character)."""
    if RUN_ID_RE.match(name) and ".." not in name:
        return None
    return (
        f"{what} {shown(name)!r} is not a plain name: use letters, digits, '.', '_' and '-' "
        "(starting with a letter or digit, no '..', at most 128 characters)"
    )


def shown(text: str, limit: int = 60) -> str:
    """`text` for an error line: control characters and undecodable bytes escaped, at most `limit` long."""
    return text.encode("unicode_escape").decode("ascii")[:limit]


def require_text(text: str, what: str) -> str:
    """`text` as the store can hold it: valid UTF-8. Bytes that are not UTF-8 on a command line (a
    non-UTF-8 locale, `$'\\xff'`) reach Python as lone surrogates, which DuckDB refuses when the run is
    stored, after the measuring: they are refused here, before anything runs."""
    bad = sorted({c for c in text if 0xD800 <= ord(c) <= 0xDFFF})
    if bad:
        codes = " ".join(f"\\x{ord(c) - 0xDC00:02x}" if ord(c) >= 0xDC80 else f"U+{ord(c):04X}" for c in bad)
        raise SpecError(f"{what} {shown(text)!r} is not valid UTF-8 (it holds {codes}): use UTF-8 text")
    return text


def validate_label(label: str) -> str:
    """A label is printed on terminals and in reports and stored: valid UTF-8, no control characters
    (ESC, BEL, newlines...), no invisible ones, not empty, at most LABEL_MAX characters. Returns it in NFC,
    stripped of surrounding spaces: `café` typed composed or decomposed is one label, and `night\u200bly`
    (a zero-width space) cannot pose as `nightly`."""
    name = normalized_name(require_text(label, "label"))
    if not name:
        raise SpecError("a label cannot be empty")
    bad = [c for c in name if _is_control(c)]
    if bad:
        raise SpecError(
            f"label {shown(name)!r} holds control characters "
            f"({', '.join(sorted({f'U+{ord(c):04X}' for c in bad}))})"
        )
    hidden = invisible_characters(name)
    if hidden:
        raise SpecError(
            f"label {shown(name)!r} holds invisible characters ({', '.join(hidden)}): "
            "a label must look like what it is"
        )
    if len(name) > LABEL_MAX:
        raise SpecError(f"label is {len(name)} characters long: at most {LABEL_MAX}")
    if "," in name:  # report, compare and db export --run split on commas: `--run a,b` could never name it
        raise SpecError(
            f"label {shown(name)!r} holds a comma: --run takes runs and labels separated by commas"
        )
    return name


def normalized_name(text: str) -> str:
    """A name as it is stored and looked up: NFC, surrounding spaces stripped."""
    return unicodedata.normalize("NFC", text).strip()


# fillers that render as blank space although they are letters (Hangul fillers, braille blank)
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def invisible_characters(text: str) -> list[str]:
    """The code points of `text` that print as nothing (format characters: zero-width spaces, bidi
    overrides, BOM, soft hyphen; blank fillers), as U+XXXX. A zero-width joiner between two symbols is
    part of an emoji sequence and is kept."""
    out = set()
    for i, c in enumerate(text):
        if c == "\u200d" and 0 < i < len(text) - 1 and _emoji_part(text[i - 1]) and _emoji_part(text[i + 1]):
            continue
        if unicodedata.category(c) == "Cf" or c in _BLANK_LETTERS:
            out.add(f"U+{ord(c):04X}")
    return sorted(out)


def _emoji_part(c: str) -> bool:
    return unicodedata.category(c) in ("So", "Sk", "Mn") or 0x1F3FB <= ord(c) <= 0x1F3FF or c == "\ufe0f"


def _is_control(c: str) -> bool:
    o = ord(c)
    return o < 32 or 0x7F <= o < 0xA0 or c in "\u2028\u2029"
