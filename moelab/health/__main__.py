"""`python -m moelab.health [--load-ms N] [--local-gpu I]`: print this node's health snapshot as JSON.

The launcher runs this in a child process before and after each backend job (so the load's CUDA context never
lives in the launcher, and a hung GPU cannot hang it), and on every node for a multi-node doctor.
"""

from __future__ import annotations

import argparse
import json

from moelab.health.snapshot import take_snapshot


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m moelab.health", description=__doc__)
    ap.add_argument(
        "--load-ms", type=float, default=300.0, help="matmul load per GPU to read clocks under load"
    )
    ap.add_argument(
        "--local-gpu", type=int, default=None, help="the rank's GPU (NVML index), for affinity checks"
    )
    ap.add_argument("--sysfs-root", default="/", help="root of the sysfs tree (tests)")
    args = ap.parse_args(argv)
    snap = take_snapshot(load_ms=args.load_ms, local_gpu=args.local_gpu, sysfs_root=args.sysfs_root)
    print(json.dumps(snap.to_dict(), sort_keys=True))


if __name__ == "__main__":
    main()
