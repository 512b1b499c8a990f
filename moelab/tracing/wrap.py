"""Run every rank of one backend job under an external tool: nsys for `--trace nsys`, or any command
for `--wrap 'ncu …'`.

The wrapper goes between the launcher and each rank's `python -m moelab.measure.worker`, never around the
launcher, so each rank gets its own report: `torchrun … --no-python <wrapper> python -m moelab.measure.worker …`
(torchrun's `--no-python` replaces its `-m`: the two are exclusive), `srun … <wrapper> python -m …`,
`mpirun … <wrapper> python -m …`.

`--wrap` placeholders: `{out}` becomes `<out_dir>/<name>_rank<R>` and `{rank}` the rank, both expanded
by a small `sh -c` when each rank starts (the rank variable of its launcher: RANK, SLURM_PROCID,
OMPI_COMM_WORLD_RANK), so this works for tools without their own `%q{VAR}` file-name pattern.
Example: `--wrap 'ncu --profile-from-start off --set full -o {out}'`: with `--profile-from-start off`
ncu measures only kernels inside the worker's cudaProfilerStart/Stop range (the timed region).
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from moelab.core.errors import MoelabError
from moelab.tracing.nsys import RANK_VARS

WORKER_MODULE = "moelab.measure.worker"
_PLACEHOLDER = re.compile(r"(\{out\}|\{rank\})")


def wrap_prefix_argv(wrap: str, out_dir: Path | str, name: str, rank_var: str = "RANK") -> list[str]:
    """The per-rank argv prefix for a user's `--wrap` command; its tool must be on PATH."""
    if rank_var not in RANK_VARS:
        raise MoelabError(f"rank variable must be one of {', '.join(RANK_VARS)}, got {rank_var!r}")
    try:
        tokens = shlex.split(wrap)
    except ValueError as exc:
        raise MoelabError(f"--wrap {wrap!r}: {exc}") from None
    if not tokens:
        raise MoelabError("--wrap is empty: give a command such as 'ncu --set full -o {out}'")
    tool = shutil.which(tokens[0])
    if tool is None:
        raise MoelabError(f"--wrap: {tokens[0]} not found on PATH")
    tokens[0] = tool
    if not any(_PLACEHOLDER.search(t) for t in tokens):
        return tokens
    out_stem = f"{Path(out_dir) / name}_rank"
    words = []
    for tok in tokens:
        parts = []
        for part in _PLACEHOLDER.split(tok):
            if part == "{rank}":
                parts.append(f'"${{{rank_var}}}"')
            elif part == "{out}":
                parts.append(shlex.quote(out_stem) + f'"${{{rank_var}}}"')
            elif part:
                parts.append(shlex.quote(part))
        words.append("".join(parts))
    return ["sh", "-c", f'exec {" ".join(words)} "$@"', "moelab-wrap"]


def splice_rank_wrapper(
    argv: Sequence[str], prefix: Sequence[str], python: str = sys.executable
) -> list[str]:
    """Insert `prefix` before the worker in a launcher's argv (torchrun, srun, mpirun forms)."""
    argv = list(argv)
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == WORKER_MODULE:
            break
    else:
        raise ValueError(f"no '-m {WORKER_MODULE}' in the launcher command: {' '.join(argv)}")
    if not prefix:
        return argv
    if i > 0 and Path(argv[i - 1]).name.startswith("python"):
        return argv[: i - 1] + list(prefix) + argv[i - 1 :]
    # torchrun's own -m/--module flag: run the wrapper as the entry point instead
    return argv[:i] + ["--no-python", *prefix, python, "-m", WORKER_MODULE] + argv[i + 2 :]
