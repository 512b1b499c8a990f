"""The history a stored run is judged against, read by the store that owns its tables: per op, the spreads
of earlier runs of the same case on the same GPU model, and the latest earlier run of the same case and
fingerprint (host, GPU, driver, CUDA, NCCL, torch, libraries). moelab.health's rules are pure functions of
these rows; `judge_stored_run` (called after each ingest, moelab.store.judgments) joins the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moelab.health.drift import (
    DRIFT_TOLERANCE,
    JUDGED_DEVICES,
    Drift,
    OpMedian,
    not_judged_reason,
)
from moelab.health.drift import (
    drift_flags as drift_rule,
)
from moelab.health.judge import Judgment, judgments
from moelab.health.spread import FAR_ABOVE, NOISE_TARGET, OpSpread, SpreadFlag
from moelab.health.spread import spread_flags as spread_rule

_FINGERPRINT = """
    SELECT run_id, backend, any_value(host) AS host, any_value(gpu_name) AS gpu_name, any_value(driver) AS driver,
           any_value(cuda) AS cuda, any_value(nccl) AS nccl, any_value(torch) AS torch,
           any_value(CAST(library_versions AS VARCHAR)) AS libs
    FROM environment GROUP BY run_id, backend
"""


def run_device(con: Any, run_id: str) -> str | None:
    found = con.execute("SELECT device FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return None if found is None else str(found[0])


def tool_timed_backends(con: Any, run_id: str) -> list[str]:
    """Backends of `run_id` whose results are their tool's own timing (host jobs, one figure per size, e.g.
    an external benchmark binary), which the judgements of moelab's samples leave out."""
    from moelab.backends import registry  # the backend classes import torch: only when a run is judged

    stored = con.execute(
        "SELECT DISTINCT backend FROM results WHERE run_id = ? ORDER BY 1", [run_id]
    ).fetchall()
    return registry.host_jobs(r[0] for r in stored)


def op_spreads(con: Any, run_id: str, device: str, leave_out: Sequence[str]) -> list[OpSpread]:
    """Each op of `run_id` (backends `leave_out` left out) with the spreads of the same backend, case and op
    in earlier runs on `device` and the same GPU model."""
    rows = con.execute(
        """
        WITH gpu AS (SELECT run_id, backend, any_value(gpu_name) AS gpu_name FROM environment GROUP BY ALL),
        cur AS (
            SELECT r.backend, r.case_id, r.op, r.rel_iqr, g.gpu_name, ru.created_at
            FROM results r JOIN runs ru USING (run_id) LEFT JOIN gpu g USING (run_id, backend)
            WHERE r.run_id = ? AND r.rel_iqr IS NOT NULL AND NOT list_contains(?::VARCHAR[], r.backend))
        SELECT cur.backend, cur.case_id, cur.op, cur.rel_iqr,
               (SELECT list(h.rel_iqr) FROM results h JOIN runs hr USING (run_id) LEFT JOIN gpu hg USING (run_id, backend)
                WHERE h.backend = cur.backend AND h.case_id = cur.case_id AND h.op = cur.op AND h.run_id <> ?
                  AND hr.created_at < cur.created_at AND hr.device = ?
                  AND hg.gpu_name IS NOT DISTINCT FROM cur.gpu_name AND h.rel_iqr IS NOT NULL) AS history
        FROM cur ORDER BY cur.backend, cur.case_id, cur.op
        """,
        [run_id, list(leave_out), run_id, device],
    ).fetchall()
    return [
        OpSpread(b, c, op, float(rel), tuple(float(h) for h in history or [] if h is not None))
        for b, c, op, rel, history in rows
    ]


def op_medians(con: Any, run_id: str, device: str, leave_out: Sequence[str]) -> list[OpMedian]:
    """Each measured op of `run_id` (backends `leave_out` left out) with the latest earlier run on `device`
    of the same case and fingerprint, and its median."""
    rows = con.execute(
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
        [run_id, list(leave_out), run_id, device],
    ).fetchall()
    return [
        OpMedian(
            b, c, op, float(median), *((str(prev[0]), float(prev[1])) if prev is not None else (None, None))
        )
        for b, c, op, median, prev in rows
    ]


def spread_flags(
    con: Any,
    run_id: str,
    noise_target: float = NOISE_TARGET,
    far_above: float = FAR_ABOVE,
    devices: Sequence[str] = JUDGED_DEVICES,
) -> list[SpreadFlag]:
    """moelab.health.spread's rule on the ops of `run_id`, host jobs left out; only runs on `devices`."""
    device = run_device(con, run_id)
    if device is None or device not in devices:
        return []
    ops = op_spreads(con, run_id, device, tool_timed_backends(con, run_id))
    return spread_rule(ops, noise_target, far_above)


def drift_flags(
    con: Any, run_id: str, tolerance: float = DRIFT_TOLERANCE, devices: Sequence[str] = JUDGED_DEVICES
) -> list[Drift]:
    """moelab.health.drift's rule on the ops of `run_id`, host jobs left out; only runs on `devices`."""
    device = run_device(con, run_id)
    if device is None or device not in devices:
        return []
    return drift_rule(op_medians(con, run_id, device, tool_timed_backends(con, run_id)), tolerance)


def not_judged(
    con: Any, run_id: str, devices: Sequence[str] = JUDGED_DEVICES, exact: bool = True
) -> str | None:
    """Why a run's medians were not (all) held against an earlier run, in one line; None when every measured
    op was. Not `exact` (views that must not import the backends, hence torch): host jobs are not told
    apart."""
    device = run_device(con, run_id)
    if device is None:
        return None
    ops = op_medians(con, run_id, device, tool_timed_backends(con, run_id) if exact else ())
    return not_judged_reason(run_id, device, ops, devices, exact)


def judge_stored_run(con: Any, run_id: str) -> list[Judgment]:
    """Every judgment of `run_id` against the store's history, in the order they read best."""
    return judgments(run_id, spread_flags(con, run_id), drift_flags(con, run_id))
