"""Backend names → classes: built-ins by import path (so listing them imports no GPU library),
plus out-of-tree ones from the entry-point group `moelab.backends`. A class is a Backend (moelab's ranks
run it) or a HostJob (the launching host runs the whole job); what else it declares (its library's own
test, its tune space, its capabilities) is read from the class, never from its name."""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from moelab.backends.base import Backend, HostJob, Registered
from moelab.core.errors import BackendUnavailable, MoelabError
from moelab.core.spec import LaunchSpec
from moelab.core.validate import plain_name_problem

ENTRY_POINT_GROUP = "moelab.backends"
# a plugin's import and its availability() run under this limit: a plugin that hangs there would hang every
# command that lists or plans backends, with no output
PLUGIN_TIME_LIMIT_S = 15.0
DEFAULT_BACKEND = "nccl-a2a"  # what `moelab run` measures when no --backend is given

BUILTIN: dict[str, str] = {
    "nccl-a2a": "moelab.backends.nccl_a2a:NcclA2ABackend",
    "mxfp8-a2a": "moelab.backends.mxfp8_a2a:Mxfp8A2ABackend",
    "deepep": "moelab.backends.deepep:DeepEPBackend",
    "deepep-ll": "moelab.backends.deepep_ll:DeepEPLowLatencyBackend",
    "hybrid-ep": "moelab.backends.hybrid_ep:HybridEPBackend",
    "nccl-tests": "moelab.backends.nccl_tests_job:NcclTestsJob",
    "torch-symm-a2a": "moelab.backends.torch_symm_a2a:TorchSymmA2ABackend",
    "nccl-ep": "moelab.backends.nccl_ep:NcclEPBackend",
    "uccl-ep": "moelab.backends.uccl_ep:UcclEPBackend",
}


@dataclass(frozen=True, slots=True)
class BackendEntry:
    name: str
    target: str  # "module:Class"
    origin: str  # "builtin" or the distribution that registered it
    problem: str | None = None  # why this plugin is refused: its name is not a plain name (a path, ESC bytes)


T = TypeVar("T")
_FAILED_IMPORTS: dict[str, BackendUnavailable] = {}  # a plugin import that failed or hung is not retried


def _bounded(fn: Callable[[], T], what: str) -> T:
    """`fn()` in a daemon thread, waited for at most PLUGIN_TIME_LIMIT_S: a plugin's code that hangs, calls
    sys.exit or raises KeyboardInterrupt becomes one BackendUnavailable line, not a hang or an exit code of
    the plugin's choosing (3 is moelab's own "cannot judge")."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: reported, never obeyed
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="moelab-plugin", daemon=True).start()
    if not done.wait(PLUGIN_TIME_LIMIT_S):
        raise BackendUnavailable(f"{what} did not finish in {PLUGIN_TIME_LIMIT_S:g} s")
    error = box.get("error")
    if isinstance(error, BackendUnavailable):
        raise error
    if isinstance(error, ImportError):
        raise BackendUnavailable(f"{what} failed: {error}")
    if error is not None:
        raise BackendUnavailable(f"{what} failed: {type(error).__name__}: {error}")
    value: T = box["value"]
    return value


def entries() -> dict[str, BackendEntry]:
    """Every known backend; a plugin that reuses a built-in's name for another class is rejected. The entry
    points are scanned once per import path (a scan reads every installed distribution's metadata: once
    per case, --list-cases over 100,000 cases took minutes)."""
    return dict(_scan(tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _scan(import_path: tuple[str, ...]) -> tuple[tuple[str, BackendEntry], ...]:
    found = {name: BackendEntry(name, target, "builtin") for name, target in BUILTIN.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "unknown"
        if ep.name in found:
            if found[ep.name].target != ep.value:
                raise MoelabError(
                    f"backend name {ep.name!r} registered twice: {found[ep.name].target} and {ep.value} ({dist})"
                )
            continue
        found[ep.name] = BackendEntry(
            ep.name, ep.value, dist, plain_name_problem(ep.name, "plugin backend name")
        )
    return tuple(sorted(found.items()))


def resolve(name: str) -> BackendEntry:
    known = entries()
    if name not in known:
        raise MoelabError(f"unknown backend {name!r}: known backends are {', '.join(known)}")
    return known[name]


def load(name: str) -> type[Registered]:
    """The class registered as `name`: a Backend or a HostJob."""
    entry = resolve(name)
    if entry.problem:
        raise MoelabError(f"{entry.problem}; refused (registered by {entry.origin})")
    module_name, _, attr = entry.target.partition(":")
    if entry.origin != "builtin":
        module = _import_plugin(name, module_name)
        return _registered_class(name, entry, module, attr)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(f"{name}: cannot import {module_name}: {exc}") from exc
    except Exception as exc:  # a plugin whose import raises anything else: its reason, not a traceback
        raise BackendUnavailable(
            f"{name}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return _registered_class(name, entry, module, attr)


def _import_plugin(name: str, module_name: str) -> Any:
    if module_name not in _FAILED_IMPORTS:
        try:
            return _bounded(lambda: importlib.import_module(module_name), f"{name}: importing {module_name}")
        except BackendUnavailable as exc:
            _FAILED_IMPORTS[module_name] = exc
    raise _FAILED_IMPORTS[module_name]


def _registered_class(name: str, entry: BackendEntry, module: Any, attr: str) -> type[Registered]:
    cls = getattr(module, attr, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, Backend | HostJob)):
        raise MoelabError(f"backend {name!r} ({entry.target}) is not a moelab Backend class")
    return cls


def load_backend(name: str) -> type[Backend]:
    """The Backend class of `name`, for a job of moelab's ranks (a host job has none)."""
    cls = load(name)
    if not issubclass(cls, Backend):
        raise MoelabError(f"backend {name!r} is a host job: the launching host runs it, not moelab's ranks")
    return cls


def declared() -> list[tuple[str, type[Registered]]]:
    """Every backend whose class loads here, with its class: the built-ins in their listed order, then the
    plugins by name. What a command offers by default (the backends it verifies or tunes) is read from
    these classes; one that cannot be imported here is left out, as `moelab backends` says why."""
    known = entries()
    order = [n for n in BUILTIN if n in known] + [n for n in known if n not in BUILTIN]
    out = []
    for name in order:
        try:
            out.append((name, load(name)))
        except Exception:  # a broken plugin or a missing library must not break the others
            continue
    return out


def bound_traits(name: str, knobs: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """(dispatch family, combine payload type) of backend `name` for moelab model's bound; (None, "bf16")
    for a backend that is not installed here or does not say."""
    try:
        cls = load(name)
    except MoelabError:
        return None, "bf16"
    return cls.dispatch_family, cls.stored_combine_dtype(knobs or {})


def host_jobs(names: Iterable[str]) -> list[str]:
    """Those of `names` that are host jobs (their figures are the tool's own timing); names that do not
    load here (a plugin gone since a stored run) count as moelab's ranks."""
    out = []
    for name in names:
        try:
            if issubclass(load(name), HostJob):
                out.append(name)
        except Exception:
            continue
    return out


def availability(name: str, extra_path: str | None = None, launch: LaunchSpec | None = None) -> str | None:
    """None when `name` can run here, else why not (one line). With `extra_path` (the backend's own library
    build, --backend-path) the check runs in a child process with that path first, as the backend's job will."""
    if extra_path is not None:
        try:
            unbuilt = load(name).unbuilt(Path(extra_path))
        except MoelabError as exc:
            return str(exc)
        return unbuilt or _availability_in_child(name, extra_path)
    try:
        cls = load(name)
        if resolve(name).origin == "builtin":
            return cls.availability_for(launch) if launch is not None else cls.availability()
        return _bounded(
            lambda: cls.availability_for(launch) if launch is not None else cls.availability(),
            f"{name}: availability()",
        )
    except BackendUnavailable as exc:
        return str(exc)
    except Exception as exc:  # a broken plugin must not break the listing
        return f"failed to load: {type(exc).__name__}: {exc}"


def _availability_in_child(name: str, extra_path: str) -> str | None:
    import json
    import os
    import subprocess
    import sys

    code = "import json,sys; from moelab.backends import registry; print(json.dumps(registry.availability(sys.argv[1])))"
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, pkg_root, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, name], capture_output=True, text=True, env=env, timeout=120
        )
    except subprocess.TimeoutExpired:
        return f"availability check with {extra_path} timed out"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"availability check with {extra_path} failed: {tail}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return None if result is None else str(result)
