"""The SM carve-out of the overlapped layer's GEMMs: which SMs a case holds back, and that the setting is
scoped to the overlapped launches (a process-wide torch setting must never leak into the next op)."""

from __future__ import annotations

import pytest
import torch

from moelab.core.e2e_spec import E2ESpec
from moelab.core.errors import SpecError
from moelab.core.workload import Workload
from moelab.measure.e2e.carveout import carveout_reason, gemm_carveout

WL = Workload(hidden=1024)


@pytest.mark.parametrize(
    ("knobs", "sms", "expected"),
    [
        ({"mode": "tbo"}, 24, 24),  # auto: the SMs the communication is held to
        ({"mode": "chunked"}, 16, 16),
        ({"mode": "tbo"}, None, 0),  # the library's default SMs: nothing held back
        ({"mode": "serial"}, 24, 0),  # nothing runs beside a serial layer's GEMMs
        ({"mode": "tbo", "carveout": 8}, 24, 8),
        ({"mode": "tbo", "carveout": 0}, 24, 0),
    ],
)
def test_carveout_resolution(knobs: dict[str, object], sms: int | None, expected: int) -> None:
    s = E2ESpec.from_knobs(knobs).resolve(WL, sms)
    assert s.carveout == expected
    assert s.to_record("grouped")["carveout"] == expected


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"mode": "serial", "carveout": 8}, "needs an overlapped mode"),
        ({"mode": "tbo", "carveout": -1}, "auto or a number of SMs"),
        ({"mode": "tbo", "carveout": "half"}, "auto or a number of SMs"),
        ({"mode": "tbo", "carveout": True}, "auto or a number of SMs"),
    ],
)
def test_bad_carveouts_are_refused(knobs: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        E2ESpec.from_knobs(knobs).resolve(WL, 24)


def test_carveout_is_a_no_op_off_cuda() -> None:
    before = torch._C._get_sm_carveout_experimental()
    with gemm_carveout(24, torch.device("cpu")):
        assert torch._C._get_sm_carveout_experimental() == before
    assert carveout_reason(24, torch.device("cpu")) is None


@pytest.mark.gpu
def test_carveout_is_set_inside_and_restored_after() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda", 0)
    before = torch._C._get_sm_carveout_experimental()
    with gemm_carveout(24, device):
        assert torch._C._get_sm_carveout_experimental() == 24
    assert torch._C._get_sm_carveout_experimental() == before
    total = torch.cuda.get_device_properties(device).multi_processor_count
    assert carveout_reason(total, device) is not None
