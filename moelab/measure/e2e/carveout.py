"""SMs held back from the expert GEMMs while communication runs beside them (the overlapped schedules).

torch's GEMMs on Hopper size their grids to the whole GPU: cuBLAS, and the persistent CUTLASS kernel of
`torch._grouped_mm` (one CTA per SM, each looping over tiles). A communication kernel launched under such
a GEMM finds no free SM and waits for it to drain: on 2xH200 only 19-23% of DeepEP's kernel time ran
under the GEMMs of the two-batch overlap (results/h200x2-r3). torch's experimental SM carve-out makes
the GEMMs launched while it is set leave that many SMs free (GroupMM.cu: `hw_info.sm_count =
multiProcessorCount - carveout`), the way DeepSeek's DeepGEMM is held to the SMs DeepEP leaves. It is a
process-wide setting read when a GEMM is launched, so it is set around the overlapped layer's launches
(forward and backward) and restored after. moelab's Triton grouped GEMM (`gemm = triton`) reads it too: a
grid of one program per output tile would fill every SM as torch's uncarved GEMMs do, so under a
carve-out it launches one program per SM left to it, each looping over tiles (`held_sms`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch


def _set(sms: int | None) -> None:
    with warnings.catch_warnings():  # torch warns once that the setting is experimental
        warnings.simplefilter("ignore")
        torch._C._set_sm_carveout_experimental(sms)


def available() -> bool:
    return hasattr(torch._C, "_set_sm_carveout_experimental")


def held_sms() -> int:
    """The SMs the GEMMs launched now must leave free (0 where no carve-out is set): moelab's own Triton
    GEMM reads it at launch (moelab.measure.e2e.grouped_gemm), as torch's GEMMs do."""
    if not hasattr(torch._C, "_get_sm_carveout_experimental"):
        return 0
    return int(torch._C._get_sm_carveout_experimental() or 0)


@contextlib.contextmanager
def gemm_carveout(sms: int, device: torch.device) -> Iterator[None]:
    """GEMMs launched inside leave `sms` SMs of the GPU free; nothing changes for 0 or off CUDA."""
    if sms <= 0 or device.type != "cuda" or not available():
        yield
        return
    previous = torch._C._get_sm_carveout_experimental()
    _set(sms)
    try:
        yield
    finally:
        _set(previous)


def carveout_reason(sms: int, device: torch.device) -> str | None:
    """Why `sms` SMs cannot be held back from the GEMMs on `device`, or None."""
    if sms <= 0 or device.type != "cuda":
        return None
    if not available():
        return f"e2e knob carveout = {sms}: torch {torch.__version__} has no SM carve-out for its GEMMs"
    total = torch.cuda.get_device_properties(device).multi_processor_count
    if sms >= total:
        return f"e2e knob carveout = {sms} leaves the GEMMs no SM (the GPU has {total})"
    return None
