"""`--wrap` prefixes: the tool must exist; {out} and {rank} are expanded per rank by the shell."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.core.errors import MoelabError
from moelab.tracing.wrap import splice_rank_wrapper, wrap_prefix_argv

SH = shutil.which("sh")


def test_wrap_without_placeholders_is_the_tool_argv() -> None:
    argv = wrap_prefix_argv("env FOO=1", "/o", "n")
    assert argv[0] == shutil.which("env") and argv[1:] == ["FOO=1"]


def test_wrap_errors() -> None:
    with pytest.raises(MoelabError, match="empty"):
        wrap_prefix_argv("  ", "/o", "n")
    with pytest.raises(MoelabError, match="not found"):
        wrap_prefix_argv("no-such-profiler-xyz --set full", "/o", "n")
    with pytest.raises(MoelabError, match="No closing quotation"):
        wrap_prefix_argv("ncu 'unterminated", "/o", "n")
    with pytest.raises(MoelabError, match="rank variable"):
        wrap_prefix_argv("env", "/o", "n", rank_var="LOCAL_RANK")


@pytest.mark.skipif(SH is None, reason="needs sh")
def test_placeholders_expand_per_rank_when_the_rank_starts(tmp_path: Path) -> None:
    """Run the spliced command for real, as a launcher would, with the rank in the environment."""
    out_dir = tmp_path / "traces dir"  # a space: quoting must hold
    prefix = wrap_prefix_argv(
        "env MOELAB_WRAP_OUT={out}.rep MOELAB_WRAP_RANK={rank}", out_dir, "deepep", rank_var="SLURM_PROCID"
    )
    assert prefix[:2] == ["sh", "-c"]
    launcher = [sys.executable, "-m", "moelab.measure.worker", "RUN", "deepep"]
    argv = splice_rank_wrapper(launcher, prefix)
    # swap the worker for a probe that prints what the wrapper gave it
    probe = (
        "import os, sys; print(os.environ['MOELAB_WRAP_OUT'], os.environ['MOELAB_WRAP_RANK'], sys.argv[1:])"
    )
    argv = argv[: argv.index("-m")] + ["-c", probe, "RUN", "deepep"]
    env = dict(os.environ, SLURM_PROCID="3")
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=True)
    assert res.stdout.strip() == f"{out_dir}/deepep_rank3.rep 3 ['RUN', 'deepep']"
