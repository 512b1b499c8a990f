"""The lowest version of each runtime dependency that moelab allows, and the installed ones below it.

pyproject.toml is the one place a floor is written: installed, it is moelab's distribution metadata, which
is read here; .ci/floor_pins.py reads pyproject itself for the minimum-versions lane. A dependency below
its floor fails somewhere deep (an import, a missing function, a DuckDB binder error); the command line
checks first and says which package to upgrade in one line. A dependency that is not installed is left to
the command that imports it (`moelab doctor` runs without duckdb).
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

DISTRIBUTION = "moelab"


@dataclass(frozen=True, slots=True)
class Floor:
    name: str  # the distribution, as the requirement spells it
    version: str  # the lowest version allowed (a `>=` bound)


@dataclass(frozen=True, slots=True)
class BelowFloor:
    floor: Floor
    installed: str

    def text(self) -> str:
        return f"{self.floor.name} {self.installed} is installed, moelab needs {self.floor.name}>={self.floor.version}"


def floors_of(requirements: Iterable[str]) -> list[Floor]:
    """The `>=` bound of each requirement that applies here (markers evaluated, extras left out)."""
    out = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        lows = [s.version for s in req.specifier if s.operator == ">="]
        if lows:
            out.append(Floor(req.name, max(lows, key=Version)))
    return out


def declared_floors() -> list[Floor]:
    """The floors of the installed moelab (none when moelab runs from a source tree it was not installed from)."""
    try:
        return floors_of(metadata.requires(DISTRIBUTION) or [])
    except metadata.PackageNotFoundError:
        return []


def below_floors(floors: Iterable[Floor]) -> list[BelowFloor]:
    """The installed dependencies older than their floor."""
    out = []
    for floor in floors:
        try:
            installed = metadata.version(floor.name)
        except metadata.PackageNotFoundError:
            continue
        try:
            below = Version(installed) < Version(floor.version)
        except InvalidVersion:
            continue
        if below:
            out.append(BelowFloor(floor, installed))
    return out


def floors_message() -> str | None:
    """One line naming every installed dependency below its floor, and how to upgrade; None when none is."""
    below = below_floors(declared_floors())
    if not below:
        return None
    upgrade = " ".join(f"'{b.floor.name}>={b.floor.version}'" for b in below)
    return "; ".join(b.text() for b in below) + f" (pip install -U {upgrade})"
