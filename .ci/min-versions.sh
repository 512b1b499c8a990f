#!/usr/bin/env bash
# The minimum-versions lane: each runtime dependency at exactly the floor pyproject.toml allows
# (.ci/floor_pins.py), in a virtualenv of its own (no system site-packages), with CI's CPU torch 2.13.0;
# then the store, report and CLI tests. A floor no test has seen is not allowed: raise it or fix the code.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m venv "$work/venv"
py="$work/venv/bin/python"
python .ci/floor_pins.py >"$work/floors.txt"
"$py" -m pip install -q torch==2.13.0
"$py" -m pip install -q -r "$work/floors.txt" pytest pytest-timeout hypothesis
"$py" -m pip install -q --no-deps -e .
"$py" .ci/floor_pins.py --check  # prints the versions the lane runs on
# the tests run from the checkout, against the venv's packages only
"$py" -m pytest -q -p no:cacheprovider tests/store tests/reports tests/cli
