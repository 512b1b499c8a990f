"""The minimum-versions lane's pins: `name==floor` for each runtime dependency of pyproject.toml that
applies here, read with the same parser as the command line's own check (moelab.core.floors). torch is
left out: CI installs its CPU wheel 2.13.0, the one on the machine's disk.

    python .ci/floor_pins.py            # the pins, one a line (pip's requirements format)
    python .ci/floor_pins.py --check    # in the lane's environment: each installed at its floor, printed
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # python 3.10
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from moelab.core.floors import floors_of  # noqa: E402

UNPINNED = {"torch"}


def main(argv: list[str]) -> int:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    floors = [f for f in floors_of(deps) if f.name not in UNPINNED]
    if "--check" not in argv:
        print("\n".join(f"{f.name}=={f.version}" for f in floors))
        return 0
    ran, wrong = [], []
    for f in floors:
        installed = metadata.version(f.name)
        ran.append(f"{f.name} {installed}")
        if Version(installed) != Version(f.version):
            wrong.append(f"{f.name} {installed} (floor {f.version})")
    print("minimum-versions lane runs on: " + ", ".join(ran) + f"; torch {metadata.version('torch')}")
    if wrong:
        print("error: not at their floor: " + ", ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
