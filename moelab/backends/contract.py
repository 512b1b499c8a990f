"""What a registered backend class must agree with before any run: `moelab backends --check NAME`.

Each rule here was once learned only after a run failed or came back empty: a library op the backend never
times (verify's row is "missing" after both runs), a knob name the e2e layer reserves (tune dies in its
second round), a figure verify compares against that no definition names (nothing stored under it). One
line per problem, so a plugin author fixes them all at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from moelab.backends.base import Backend, Registered
from moelab.backends.capabilities import ChainedPairs, LibraryFigures
from moelab.backends.library_test import Comparison, LibraryTest, VerifyConfig
from moelab.core.definitions import DEFINITIONS
from moelab.core.e2e_spec import BENCH_KNOB, E2E_KEYS
from moelab.core.ops import ops_for
from moelab.core.rows import RankRows

RESERVED_KNOBS = (BENCH_KNOB, *E2E_KEYS)  # a case's knobs by these names go to the e2e layer, not the backend
# the configuration the checker asks a library test's comparisons for: verify's default payloads
PROBE_CONFIG = VerifyConfig(
    hidden=7168, tokens_per_rank=4096, topk=8, experts_per_rank=8, dtypes=("bf16", "fp8"), sms=None
)


def offered_ops(cls: type[Backend]) -> tuple[str, ...]:
    """The ops moelab times for a backend of this class (the pair op where the class may chain pairs)."""
    return ops_for(cls.phases, chains=issubclass(cls, ChainedPairs))


def problems(name: str, cls: type[Registered]) -> list[str]:
    """Every way `cls`, registered as `name`, breaks the plugin contract; empty when it holds."""
    found = _name_problems(name, cls) + _knob_problems(cls)
    if issubclass(cls, Backend):
        found += _op_problems(cls)
    found += _figure_problems(cls)
    return found


def _name_problems(name: str, cls: type[Registered]) -> list[str]:
    own = getattr(cls, "name", None)
    if own != name:
        return [f"name: the class says {own!r} but is registered as {name!r}; set name = {name!r}"]
    return []


def _reserved(names: Iterable[str]) -> list[str]:
    return sorted(set(names) & set(RESERVED_KNOBS))


def _knob_problems(cls: type[Registered]) -> list[str]:
    declared = cls.knobs.names()
    out = [
        f"knob {k!r}: the name is reserved for the e2e layer (reserved: {', '.join(RESERVED_KNOBS)}); rename it"
        for k in _reserved(declared)
    ]
    tuning = getattr(cls, "tuning", None)
    if tuning is not None:
        tried = {k for variant in tuning.knob_variants(None) for k in variant}
        out += [
            f"tuning: knob_variants sets {k!r}, which the backend's knobs do not declare (declared: "
            f"{', '.join(declared) or 'none'})"
            for k in sorted(tried - set(declared))
        ]
    return out


def _comparisons(test: LibraryTest) -> list[Comparison]:
    return test.comparisons(PROBE_CONFIG)


def _op_problems(cls: type[Backend]) -> list[str]:
    offered = offered_ops(cls)
    timing = "splits phases (phases = True)" if cls.phases else "is timed whole (phases = False)"
    tail = f"{cls.name} {timing} and offers {', '.join(offered)}"
    out = []
    if cls.phases and cls.layout is Backend.layout:
        out.append("phases = True but layout() is not implemented: dispatch(..., layout=L) needs it")
    if isinstance(cls, LibraryFigures):  # a class declares library_ops as a class attribute
        out += [f"library_ops: {op!r} is never timed: {tail}" for op in cls.library_ops if op not in offered]
    if cls.library_test is not None:
        # moelab's side is the first of time_ops the case stored (else op itself): one must be offered
        unread = [c for c in _comparisons(cls.library_test) if not set(c.time_ops or (c.op,)) & set(offered)]
        ops = sorted({" or ".join(c.time_ops or (c.op,)) for c in unread})
        out += [f"library_test: a comparison reads op {op!r}, which is never timed: {tail}" for op in ops]
    return out


def _computed_figures(cls: type[Registered]) -> dict[str, str | None]:
    """Definition -> text of the figures the class's library_figures computes, asked with one probe row."""
    if not isinstance(cls, LibraryFigures):
        return {}
    row = RankRows(
        rank=0,
        recv_rows=8,
        recv_rows_remote=4,
        send_rows=8,
        send_rows_remote=4,
        rdma_pairs=8,
        rdma_pairs_remote=0,
    )
    rows = [row]
    out: dict[str, str | None] = {}
    for op in cls.library_ops:
        for fig in cls.library_figures(op, rows, 2, [[1.0, 2.0]]):
            out[fig.definition] = fig.text
    return out


def _figure_problems(cls: type[Registered]) -> list[str]:
    out = []
    try:
        computed = _computed_figures(cls)
    except Exception as exc:  # the probe is the author's code: say what it raised, go on
        return [f"library_figures: raised {type(exc).__name__}: {exc} when asked for one probe row"]
    out += [
        f"library_figures: figure {d!r} has no text: set Figure(text=...) so the store can define it"
        for d, text in computed.items()
        if d not in DEFINITIONS and not text
    ]
    test = cls.library_test
    if test is None:
        return out
    for c in _comparisons(test):
        if c.moelab_side == "stored" and c.figure not in DEFINITIONS and c.figure not in computed:
            out.append(
                f"library_test: figure {c.figure!r} ({c.op}) is not stored by moelab: name a built-in "
                f"definition or compute it in library_figures"
            )
        elif c.moelab_side != "stored" and c.figure not in test.definitions:
            out.append(
                f"library_test: figure {c.figure!r} ({c.op}) is derived by verify but not defined: add it to "
                f"the library test's `definitions`"
            )
    return sorted(set(out), key=out.index)


def check(name: str) -> list[str]:
    """The problems of the backend registered as `name` (loading it may raise MoelabError: one line)."""
    from moelab.backends import registry

    cls: Any = registry.load(name)
    return problems(name, cls)
