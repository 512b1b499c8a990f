"""GPU check of moelab.health: `moelab doctor` run N times in a row (the same verdict every time?), doctor
JSON of this node, a before/after pair around a real load, --bind numa.

Run on a GPU node from the repository root (needs nvidia-ml-py; no duckdb):
    python3 benchmarks/health_doctor_gpu.py --out "$OUT" --doctor-runs 5
Writes OUT/doctor_runs.json and OUT/doctor_run<i>.json (`python -m moelab.cli.main doctor --json`, run
--doctor-runs times back to back: each run's verdict, and per GPU the clock under load, the clock-event
reasons seen, and how much NVML's thermal and power violation counters grew under the load), then
OUT/doctor.json, OUT/diff.json (findings that appeared across a ~5 s all-GPU matmul burn, and whether the run
would be marked suspect) and OUT/numa_bind.json. `--only-doctor-runs` stops after the first part.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from moelab.cli.doctor import _print_report
from moelab.health.snapshot import diff, is_suspect, merge, take_snapshot
from moelab.job import numa as numa_bind


def burn(seconds: float) -> None:
    mats = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        mats.append((torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16), dev))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for a, _ in mats:
            for _ in range(8):
                a @ a
        for _, dev in mats:
            torch.cuda.synchronize(dev)


def doctor_runs(out: Path, runs: int, load_ms: float) -> list[str]:
    """`moelab doctor --json` `runs` times in a row, as a user runs it; each run's verdict and its evidence."""
    summary: list[dict[str, Any]] = []
    for i in range(1, runs + 1):
        argv = [sys.executable, "-m", "moelab.cli.main", "doctor", "--json", "--load-ms", str(load_ms)]
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        took = time.perf_counter() - t0
        (out / f"doctor_run{i}.json").write_text(done.stdout)
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            print(f"run {i}: exit {done.returncode}, no JSON; stderr: {done.stderr.strip()[-500:]}")
            summary.append({"run": i, "exit": done.returncode, "worst": None})
            continue
        gpus = [_gpu_evidence(g, report) for node in report["nodes"] for g in node["gpus"]]
        summary.append(
            {"run": i, "exit": done.returncode, "worst": report["worst"], "seconds": took, "gpus": gpus}
        )
        print(f"run {i}: exit {done.returncode}, worst {report['worst']} ({took:.1f} s)")
        for g in gpus:
            print(
                f"  gpu{g['index']}: {g['verdict']}: {g['reason']} | clock {g['clock_mhz']} (min {g['clock_min_mhz']}) "
                f"of {g['max_mhz']} MHz; reasons under load {g['reasons']}; thermal +{g['thermal_ns']} ns, "
                f"power +{g['power_ns']} ns over {g['window_ms']} ms"
            )
    verdicts = [str(r["worst"]) for r in summary]
    same = len(set(verdicts)) == 1
    print(f"verdicts over {runs} runs: {', '.join(verdicts)}; the same every time: {'yes' if same else 'NO'}")
    (out / "doctor_runs.json").write_text(
        json.dumps({"runs": summary, "same_verdict": same}, indent=2) + "\n"
    )
    return verdicts


def _gpu_evidence(g: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    subject = f"gpu{g['index']}"
    clock = next(
        (f for f in report["findings"] if f["subject"] == subject and f["check"] == "clock_under_load"),
        {"status": "?", "reason": "no clock_under_load finding"},
    )
    return {
        "index": g["index"],
        "verdict": clock["status"],
        "reason": clock["reason"],
        "clock_mhz": g.get("loaded_sm_clock_mhz"),
        "clock_min_mhz": g.get("loaded_sm_clock_min_mhz"),
        "max_mhz": g.get("max_sm_clock_mhz"),
        "reasons": g.get("loaded_reason_samples"),
        "samples": g.get("loaded_samples"),
        "thermal_ns": g.get("loaded_thermal_violation_ns"),
        "power_ns": g.get("loaded_power_violation_ns"),
        "window_ms": g.get("loaded_window_ms"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--load-ms", type=float, default=300.0)
    ap.add_argument("--burn-s", type=float, default=5.0)
    ap.add_argument("--doctor-runs", type=int, default=5, help="`moelab doctor` runs in a row (0: none)")
    ap.add_argument("--only-doctor-runs", action="store_true", help="stop after the doctor runs")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.doctor_runs:
        doctor_runs(args.out, args.doctor_runs, args.load_ms)
    if args.only_doctor_runs:
        return

    t0 = time.perf_counter()
    before = take_snapshot(load_ms=args.load_ms)
    took = time.perf_counter() - t0
    report = merge([before])
    (args.out / "doctor.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    _print_report(report)
    print(
        f"snapshot took {took:.2f} s with {args.load_ms:.0f} ms load per GPU; unavailable: {before.unavailable}"
    )
    for g in before.gpus:
        print(f"gpu{g.index}: unavailable {g.unavailable}")

    burn(args.burn_s)
    after = take_snapshot(load_ms=args.load_ms)
    found = diff(before, after)
    (args.out / "diff.json").write_text(
        json.dumps({"suspect": is_suspect(found), "findings": [f.to_dict() for f in found]}, indent=2) + "\n"
    )
    print(f"diff after a {args.burn_s:.0f} s burn: suspect={is_suspect(found)}")
    for f in found:
        print(f"  {f.status} {f.subject} {f.check}: {f.reason}")

    bindings = []
    for i in range(torch.cuda.device_count()):
        b = numa_bind.resolve_binding(i, uuid=numa_bind.cuda_uuid(i))
        bindings.append(dataclass_dict(b))
    applied = numa_bind.apply_binding(numa_bind.resolve_binding(0, uuid=numa_bind.cuda_uuid(0)))
    (args.out / "numa_bind.json").write_text(
        json.dumps({"resolved": bindings, "applied_gpu0": applied.to_dict()}, indent=2) + "\n"
    )
    print("numa bindings:", bindings)
    print("applied for GPU 0:", applied.to_dict())


def dataclass_dict(obj: object) -> dict:
    import dataclasses

    return dataclasses.asdict(obj)  # type: ignore[call-overload]


if __name__ == "__main__":
    main()
