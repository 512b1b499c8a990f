"""GPU check of moelab.health: doctor JSON of this node, a before/after pair around a real load, --bind numa.

Run on a GPU node from the repository root (needs nvidia-ml-py; no duckdb):
    python3 benchmarks/health_doctor_gpu.py --out "$OUT"
Writes OUT/doctor.json (the `moelab doctor --json` report of this node), OUT/diff.json (findings that appeared
across a ~5 s all-GPU matmul burn, and whether the run would be marked suspect) and OUT/numa_bind.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--load-ms", type=float, default=300.0)
    ap.add_argument("--burn-s", type=float, default=5.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

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
