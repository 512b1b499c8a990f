"""A rank's last step: its process groups, and the threads they run, ended while the interpreter is whole.

`dist.destroy_process_group()` only drops torch's own references. While a Python object still holds a
group (the rank's BackendContext, a backend, a cycle among them), its C++ side lives on, gloo's run-loop
and TCP-loop threads (NCCL's watchdog) with it, until the interpreter's shutdown frees the last reference;
tearing them down there, in finalization, aborted a rank now and then ("terminate called without an
active exception", SIGABRT) after every case was stored, and failed the job. So the rank drops its
references first (the caller's frame has returned), collects the cycles, destroys the groups, and says in
its log which communicator threads, if any, outlived that.

One holder is torch's own: `torch.distributed.nn.functional` evaluates `group=group.WORLD` in its functions'
defaults when it is imported. Imported after `init_process_group` (torchao's import pulls it in through
torch._dynamo, in mxfp8-a2a's job, first or not), those defaults hold the world group for good. It is
imported here, with this module, before the rank makes any group: the defaults then hold None.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before any group exists: see the docstring

COMMUNICATOR_THREAD_MARKS = ("gloo", "nccl")  # pt_gloo_runloop, gloo_tcp_loop, pt_nccl_watchdg, ...


def thread_names() -> list[str]:
    """The names of this process's threads (Linux: /proc/self/task); empty where that is not readable."""
    names = []
    tasks = Path("/proc/self/task")
    for task in sorted(tasks.iterdir()) if tasks.is_dir() else []:
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue  # a thread that ended while being listed
    return names


def communicator_threads() -> list[str]:
    """The threads a process group runs (gloo's and NCCL's, by name), sorted."""
    return sorted(n for n in thread_names() if any(m in n.lower() for m in COMMUNICATOR_THREAD_MARKS))


def release_process_groups() -> list[str]:
    """Destroy every process group once nothing else holds one; returns the communicator threads left
    (none when every reference was dropped). Call it after the frame that held the groups returned."""
    gc.collect()  # cycles that still hold a group or a backend, freed now rather than in finalization
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    return communicator_threads()


def teardown_line(left: list[str]) -> str:
    """The rank log's last line about its communicators."""
    if not left:
        return f"teardown: process groups destroyed, no communicator thread left (pid {os.getpid()})"
    return (
        f"teardown: communicator threads still running after the process groups were destroyed: "
        f"{', '.join(left)} (something still holds a group; they end at interpreter shutdown)"
    )
