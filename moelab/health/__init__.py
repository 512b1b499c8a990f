"""Node health: probe GPUs (NVML), NICs and NUMA placement (sysfs, lspci), judge them with sourced rules.

`take_snapshot()` → `HealthSnapshot` (JSON-serialisable); `rules.evaluate()` → findings per node;
`rules.compare_nodes()` → cross-node outliers; `diff(before, after)` + `is_suspect()` → whether a run's
results came from a machine that got sick while it ran; `judge` rules on a stored run (spread, drift).
"""

from moelab.health.model import Finding, GpuState, HealthSnapshot, NicState, worst_status
from moelab.health.rules import compare_nodes, evaluate
from moelab.health.snapshot import (
    diff,
    is_suspect,
    load_snapshots,
    merge,
    require_healthy,
    take_snapshot,
    take_snapshot_subprocess,
)

__all__ = [
    "Finding",
    "GpuState",
    "HealthSnapshot",
    "NicState",
    "compare_nodes",
    "diff",
    "evaluate",
    "is_suspect",
    "load_snapshots",
    "merge",
    "require_healthy",
    "take_snapshot",
    "take_snapshot_subprocess",
    "worst_status",
]
