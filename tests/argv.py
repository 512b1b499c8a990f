"""Command lines for tests that change one flag of a shared base: moelab refuses an option given twice
(click would keep the last without a word), so a test replaces the base's flag instead of repeating it."""

from __future__ import annotations

from collections.abc import Sequence


def _name(arg: str) -> str:
    """An option's name as the flag it sets: `--iters=3` is `--iters`, `--no-health` is `--health`."""
    name = arg.split("=", 1)[0]
    return "--" + name[len("--no-") :] if name.startswith("--no-") else name


def with_flags(base: Sequence[str], *extra: str) -> list[str]:
    """`base` with each option `extra` gives taken out (with its value), then `extra` appended."""
    given = {_name(a) for a in extra if a.startswith("--")}
    out: list[str] = []
    i = 0
    while i < len(base):
        arg = base[i]
        if arg.startswith("--") and _name(arg) in given:
            takes_value = "=" not in arg and i + 1 < len(base) and not base[i + 1].startswith("--")
            i += 2 if takes_value else 1
            continue
        out.append(arg)
        i += 1
    return out + list(extra)
