"""On one CUDA device: the run's device rates, the dense matmul as a burst and back to back at the power
limit (moelab.measure.peaks.measure_device_rates). Skipped cleanly without CUDA."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

from moelab.measure.peaks import measure_device_rates
from moelab.measure.timing import Clock

pytestmark = pytest.mark.gpu


def test_the_sustained_matmul_rate_is_stored_beside_the_burst() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rates = {r.name: r for r in measure_device_rates(Clock(torch.device("cuda", 0), None, flush_l2=True))}
    finally:
        dist.destroy_process_group()
    assert set(rates) == {"dense_bf16_matmul", "dense_bf16_matmul_sustained", "hbm_copy"}
    burst, sustained = rates["dense_bf16_matmul"].value, rates["dense_bf16_matmul_sustained"].value
    print(f"dense bf16 matmul: burst {burst:.0f}, sustained {sustained:.0f} TFLOP/s")
    # one matmul and its rate: the sustained figure is a second of the same work, never far above the burst
    assert 0 < sustained <= burst * 1.05 and rates["dense_bf16_matmul_sustained"].unit == "TFLOP/s"
