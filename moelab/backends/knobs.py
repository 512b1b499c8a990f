"""A backend's knobs as one typed, kw-only config class (as torchtitan's dispatchers declare theirs): each
field is a knob, and its name, default, what it does and its check come from that one declaration, so the
planner refuses a misspelt knob or a bad value (a user error) before anything launches, and the backend
reads typed values back.

A field's check follows its type: `bool` takes true or false, `int` a positive integer, a field with
`choices` one of them (the value as text). A rule between knobs, or against the workload, goes in
`check`. Messages keep each backend's wording: `refusal` and `unknown_message` are templates.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from moelab.core.errors import SpecError
from moelab.core.workload import Workload

REFUSAL = "{owner}: {name} must be {want}, got {value!r}"
UNKNOWN = "{owner}: unknown knob(s) {unknown} (valid knobs: {valid})"
_RULE = "moelab_knob"

K = TypeVar("K", bound="Knobs")


@dataclass(frozen=True, slots=True)
class KnobRule:
    """What one knob is (help) and which values it takes (choices, else its type's)."""

    help: str
    choices: tuple[str, ...] = ()
    refusal: str = REFUSAL  # placeholders: owner, name, want, value, choices


def knob(default: Any, help: str, *, choices: Sequence[str] = (), refusal: str = REFUSAL) -> Any:
    """A field of a Knobs class: its default, what it does, and the values it takes."""
    return field(
        default=default, metadata={_RULE: KnobRule(help=help, choices=tuple(choices), refusal=refusal)}
    )


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """Subclass with `knob(...)` fields; this class itself is the config of a backend that has no knobs."""

    owner: ClassVar[str] = ""  # the name messages start with ("": the backend's)
    unknown_message: ClassVar[str] = UNKNOWN  # placeholders: owner, unknown, valid (sorted), declared

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def refuse_unknown(cls, values: Mapping[str, Any], owner: str = "", message: str = "") -> None:
        """SpecError naming the knobs of `values` this config does not have (`message`: another wording)."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise SpecError(
                (message or cls.unknown_message).format(
                    owner=cls.owner or owner,
                    unknown=", ".join(unknown),
                    valid=", ".join(sorted(cls.names())) or "none",
                    declared=", ".join(cls.names()),
                )
            )

    @classmethod
    def parse(cls: type[K], values: Mapping[str, Any], owner: str = "") -> K:
        """The typed config of `values` (a case's knobs); SpecError (one line) for an unknown knob or a bad value."""
        cls.refuse_unknown(values, owner)
        types = typing.get_type_hints(cls)
        given = {
            f.name: _checked(f.name, types[f.name], f.metadata[_RULE], values[f.name], cls.owner or owner)
            for f in fields(cls)
            if f.name in values and values[f.name] is not None
        }
        return cls(**given)

    def check(self, workload: Workload) -> None:
        """Rules between knobs or against the case's workload (none by default); SpecError when broken."""


def _checked(name: str, annotation: Any, rule: KnobRule, value: Any, owner: str) -> Any:
    kinds = set(typing.get_args(annotation)) or {annotation}

    def refuse(want: str, shown: Any) -> SpecError:
        return SpecError(
            rule.refusal.format(
                owner=owner, name=name, want=want, value=shown, choices=", ".join(rule.choices)
            )
        )

    if rule.choices:
        text = str(value)
        if text not in rule.choices:
            raise refuse(f"one of {', '.join(rule.choices)}", text)
        return text
    if bool in kinds:
        if not isinstance(value, bool):
            raise refuse("true or false", value)
        return value
    if int in kinds and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise refuse("a positive integer", value)
    return value
