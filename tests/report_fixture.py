"""The report tests' fixture database: two backends swept over SMs and tokens on an H200, one with a
bandwidth above the link peak, extra rows (traces, case metrics, health, a suspect case), and hostile
strings in the hostname, the label and a backend's library version."""

from __future__ import annotations

from pathlib import Path

from tests.synthetic_runs import BackendModel, RunModel, add_extras, build_db

HOSTILE = "<script>document.title='PWNED'</script><img src=x onerror=alert(1)>"


def build_report_db(root: Path, hostile: bool = True) -> tuple[Path, str]:
    db = root / "report.duckdb"
    h = HOSTILE if hostile else ""
    model = RunModel(
        run_id="20261122T070000Z-fixture",
        label=f"main{h}",
        host=f"gpu-node-1{h}",
        backends=(
            BackendModel(
                name="nccl-a2a", alpha_us=25, peak_gbps=250, sat_sms=24, library_versions={"torch": "2.11.0"}
            ),
            BackendModel(
                name="deepep",
                alpha_us=8,
                peak_gbps=800,
                sat_sms=16,
                library_versions={"deep_ep": f"1.2.1{h}"},
                knobs={"num_max_tokens": 256},
            ),
        ),
        hidden=4096,
        tokens=(128, 512, 2048),
        sms=(8, 16, 24),
        iters=20,
    )
    (run_id,) = build_db(db, root / "runs", [model])
    add_extras(db, run_id, "deepep", hostile=h)
    return db, run_id
