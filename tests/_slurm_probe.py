"""A tiny rank program for tests/launch/test_slurm_real.py: SLURM variables -> torch.distributed (gloo) -> one file."""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from moelab.job.launchers import dist_env_from_slurm


def main(out_path: str) -> None:
    env = dist_env_from_slurm(os.environ)
    os.environ.update(env)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank * 10 + int(env["LOCAL_RANK"])]))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"env": env, "gathered": [int(t.item()) for t in gathered]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
