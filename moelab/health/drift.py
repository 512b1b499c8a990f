"""Run-to-run drift: an op whose median moved between two runs of the same case on the same machine and
software is not a figure a user can trust, however tight each run was on its own.

Within one run the noise rule (TimingSpec.noise_target) and the spread rule (health.contention) catch an op
that wanders; an op that settles into a different mode in each run (a host sync inside the op, timed by
how fast the host thread wakes) looks stable in both. So after each ingest, every op is held against the
latest earlier run of the same backend, case and op with the same host, GPU model, driver, CUDA, NCCL,
torch and library versions: a median more than DRIFT_TOLERANCE away marks the op `unstable` in both runs,
each naming the other, and the new run's case `suspect`. A changed fingerprint is never drift: that is
what `moelab check` and `moelab compare` are for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from moelab.health.contention import tool_timed_backends

DRIFT_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class Drift:
    backend: str
    case_id: str
    op: str
    median_us: float
    previous_run: str
    previous_median_us: float

    @property
    def change(self) -> float:
        return self.median_us / self.previous_median_us - 1.0

    def reason(self, other_run: str, change: float) -> str:
        return (
            f"median {100 * change:+.1f}% from run {other_run}'s (same case, host, GPU and software): "
            "this op's median moves between runs"
        )


_FINGERPRINT = """
    SELECT run_id, backend, any_value(host) AS host, any_value(gpu_name) AS gpu_name, any_value(driver) AS driver,
           any_value(cuda) AS cuda, any_value(nccl) AS nccl, any_value(torch) AS torch,
           any_value(CAST(library_versions AS VARCHAR)) AS libs
    FROM environment GROUP BY run_id, backend
"""


def _held(
    con: Any, run_id: str, device: str, leave_out: Sequence[str] | None = None
) -> list[tuple[Any, ...]]:
    """(backend, case_id, op, median, [previous run, its median] or None) per measured op of `run_id`
    (host jobs left out: `leave_out`, else found by their backend's type), the previous being the latest
    earlier run of the same case and fingerprint."""
    return con.execute(
        f"""
        WITH fp AS ({_FINGERPRINT}),
        cur AS (
            SELECT r.backend, r.case_id, r.op, r.median_us, ru.created_at, f.host, f.gpu_name, f.driver, f.cuda,
                   f.nccl, f.torch, f.libs
            FROM results r JOIN runs ru USING (run_id) JOIN fp f USING (run_id, backend)
            WHERE r.run_id = ? AND r.median_us > 0 AND NOT list_contains(?::VARCHAR[], r.backend))
        SELECT cur.backend, cur.case_id, cur.op, cur.median_us,
               (SELECT arg_max([h.run_id, CAST(h.median_us AS VARCHAR)], hr.created_at)
                FROM results h JOIN runs hr USING (run_id) JOIN fp hf USING (run_id, backend)
                WHERE h.backend = cur.backend AND h.case_id = cur.case_id AND h.op = cur.op AND h.run_id <> ?
                  AND hr.created_at < cur.created_at AND hr.device = ? AND h.median_us > 0
                  AND hf.host IS NOT DISTINCT FROM cur.host AND hf.gpu_name IS NOT DISTINCT FROM cur.gpu_name
                  AND hf.driver IS NOT DISTINCT FROM cur.driver AND hf.cuda IS NOT DISTINCT FROM cur.cuda
                  AND hf.nccl IS NOT DISTINCT FROM cur.nccl AND hf.torch IS NOT DISTINCT FROM cur.torch
                  AND hf.libs IS NOT DISTINCT FROM cur.libs) AS previous
        FROM cur ORDER BY cur.backend, cur.case_id, cur.op
        """,
        [run_id, list(tool_timed_backends(con, run_id) if leave_out is None else leave_out), run_id, device],
    ).fetchall()


def _device(con: Any, run_id: str) -> str | None:
    found = con.execute("SELECT device FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return None if found is None else str(found[0])


def drift_flags(
    con: Any, run_id: str, tolerance: float = DRIFT_TOLERANCE, devices: tuple[str, ...] = ("cuda",)
) -> list[Drift]:
    """Ops of `run_id` whose median is more than `tolerance` away from the latest earlier run of the same
    case with the same fingerprint. Only runs on `devices` (CPU timings over gloo are for function)."""
    device = _device(con, run_id)
    if device is None or device not in devices:
        return []
    out = []
    for backend, case_id, op, median, previous in _held(con, run_id, device):
        if previous is None:
            continue
        drift = Drift(backend, case_id, op, float(median), str(previous[0]), float(previous[1]))
        if abs(drift.change) > tolerance:
            out.append(drift)
    return out


def not_judged(con: Any, run_id: str, devices: tuple[str, ...] = ("cuda",), exact: bool = True) -> str | None:
    """Why a run's medians were not (all) held against an earlier run, in one line; None when every
    measured op was. Not `exact` (views that must not import the backends, hence torch): host jobs are
    not told apart, so only a run none of whose ops was held is said."""
    device = _device(con, run_id)
    if device is None:
        return None
    if device not in devices:
        return (
            f"run {run_id}: drift between runs not judged: a {device} run (timings over gloo are for "
            "function; drift and spread are judged on GPU runs only)"
        )
    held = _held(con, run_id, device, None if exact else ())
    alone = sum(1 for row in held if row[4] is None)
    if not held or not alone or (not exact and alone < len(held)):
        return None
    if alone == len(held):
        return (
            f"run {run_id}: drift between runs not judged: no earlier run of these cases with the same host, "
            "GPU, driver, CUDA, NCCL, torch and libraries"
        )
    return (
        f"run {run_id}: drift between runs judged for {len(held) - alone} of {len(held)} ops; the others have "
        "no earlier run with the same host, GPU and software"
    )
