"""The contract of a moelab backend: the one module a backend author imports.

A backend is a class registered under the entry-point group `moelab.backends` of its package:

    [project.entry-points."moelab.backends"]
    my-ep = "my_package.backend:MyBackend"

It is either a `Backend` (moelab's ranks call its `dispatch` and `combine`) or a `HostJob` (the launching
host runs a tool that launches the GPUs itself). Everything else it may declare is a class attribute or a
protocol of this module:

- `knobs`: a `Knobs` subclass whose `knob(...)` fields are the settings a suite or `--knob` may give it.
  The names in `RESERVED_KNOBS` belong to the e2e layer and may not be used.
- `phases = True` with `layout()`: moelab times layout and the payload transfer apart (ops `layout`,
  `dispatch`); without it dispatch is timed whole, and the ops are `dispatch_fresh`, `combine`,
  `roundtrip` (`offered_ops(cls)` says which).
- `LibraryFigures` (`library_ops`, `library_figures`): figures computed the way the library's own test
  computes them, each a `Figure` with a definition name and its text.
- `library_test`: a `LibraryTest` instance, the library's own benchmark that `moelab verify` runs beside
  moelab's measurement; each `Comparison` names an op the backend offers and a figure that is defined
  (a built-in definition, one of `library_figures`, or the test's `definitions` for one verify derives).
- `tuning`: a `TuneSpace` instance, what `moelab tune` varies beyond schedules and SMs.
- `DispatchAlongHandle`, `ChainedPairs`, `DefaultWorkload`, `HandleDispatchReason`: capabilities.
- For the e2e layer's schedules (moelab.measure.e2e): `MaskedRouting` (expert-chunked), `ColumnCombine`
  (mode columns: combine and dispatch_with_handle on a column slice, `column_unit` wide), `ZeroSmComm`
  (comm = zero-sm), `RecvHook` (comm = hook), `ReusedReceiveBuffer` (says why several dispatches cannot be in
  flight), `BatchedLayout` with `PartLayouts` (every part's layout and pair counts from one host read) and
  `HostExpertCounts` (the fresh dispatch's own per-expert counts in `Dispatched.recv_expert_counts`).

`moelab backends --check NAME` applies `problems` to a registered class and prints one line per problem;
docs/plugins.md walks through writing one. The built-in `NcclA2ABackend` is exported as a base to build on.
"""

from __future__ import annotations

from moelab.backends.base import (
    Backend,
    BackendContext,
    CaseConfig,
    Dispatched,
    HostJob,
    Placement,
    Registered,
)
from moelab.backends.capabilities import (
    BatchedLayout,
    ChainedPairs,
    ColumnCombine,
    DefaultWorkload,
    DispatchAlongHandle,
    HandleDispatchReason,
    HostExpertCounts,
    LibraryFigures,
    MaskedRouting,
    PartLayouts,
    RecvHook,
    ReusedReceiveBuffer,
    ZeroSmComm,
)
from moelab.backends.contract import RESERVED_KNOBS, offered_ops, problems
from moelab.backends.knobs import Knobs, knob
from moelab.backends.library_test import (
    CommandContext,
    Comparison,
    LibraryCommand,
    LibraryTest,
    VerifyConfig,
)
from moelab.backends.nccl_a2a import NcclA2ABackend
from moelab.backends.tuning import TuneSpace
from moelab.core.case_record import CaseRecord, Figure, OpResult
from moelab.core.errors import BackendUnavailable, SpecError
from moelab.core.library_figures import LibraryFigure
from moelab.core.rows import RankRows
from moelab.core.spec import CaseSpec, RunSpec
from moelab.core.stats import summarize
from moelab.core.workload import Workload
from moelab.job.local import JobOutcome
from moelab.job.rundir import JobFiles, now_iso

__all__ = [
    "RESERVED_KNOBS",
    "Backend",
    "BatchedLayout",
    "BackendContext",
    "BackendUnavailable",
    "CaseConfig",
    "CaseRecord",
    "CaseSpec",
    "ChainedPairs",
    "ColumnCombine",
    "CommandContext",
    "Comparison",
    "DefaultWorkload",
    "DispatchAlongHandle",
    "Dispatched",
    "Figure",
    "HandleDispatchReason",
    "HostExpertCounts",
    "HostJob",
    "JobFiles",
    "JobOutcome",
    "Knobs",
    "LibraryCommand",
    "LibraryFigure",
    "LibraryFigures",
    "LibraryTest",
    "MaskedRouting",
    "NcclA2ABackend",
    "OpResult",
    "PartLayouts",
    "Placement",
    "RankRows",
    "RecvHook",
    "Registered",
    "ReusedReceiveBuffer",
    "RunSpec",
    "SpecError",
    "TuneSpace",
    "VerifyConfig",
    "Workload",
    "ZeroSmComm",
    "knob",
    "now_iso",
    "offered_ops",
    "problems",
    "summarize",
]
