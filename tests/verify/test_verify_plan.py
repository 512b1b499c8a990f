"""verify's command builders (golden), the moelab cases it plans, which configurations a library's test
cannot run, and the ratio/verdict rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moelab.backends import deepep_own_tests, hybrid_ep_own_test, nccl_tests_job
from moelab.core.errors import SpecError
from moelab.core.library_figures import FAILING, judge
from moelab.core.spec import CaseSpec
from moelab.core.workload import Workload
from moelab.plan.planning import HostFacts, plan_run
from moelab.verify.libraries import expected, unsupported_reason
from moelab.verify.plan import VerifyRequest, library_way_knobs, run_request

TREE = Path("/src/DeepEP")
WL = Workload(hidden=7168, tokens_per_rank=4096, topk=8, experts_per_rank=8)


def _req(**kw: object) -> VerifyRequest:
    base: dict[str, object] = dict(backends=("deepep", "hybrid-ep", "nccl-tests"), hidden=7168, tokens_per_rank=4096,
                                   topk=8, experts_per_rank=8, dtypes=("bf16", "fp8"), sms=None)  # fmt: skip
    return VerifyRequest(**(base | kw))  # type: ignore[arg-type]


def _cases(req: VerifyRequest) -> list[CaseSpec]:
    """verify's cases as plan_run plans them on 2 CPU ranks."""
    return list(plan_run(run_request(req, cpu=True), HostFacts(), new_run_id="v1").spec.cases)


def test_deepep_intranode_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    c = deepep_own_tests.deepep_intranode(TREE, WL, 2, python="python3", master_port=29517)
    assert c.argv == ("python3", "test_intranode.py", "--num-processes", "2", "--num-tokens", "4096", "--hidden", "7168",
                      "--num-topk", "8", "--num-experts", "16")  # fmt: skip
    assert c.cwd == "/src/DeepEP/tests"
    assert c.env == {"PYTHONPATH": "/src/DeepEP", "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29517", "WORLD_SIZE": "1", "RANK": "0"}  # fmt: skip
    assert c.shell_line() == (
        "cd /src/DeepEP/tests && MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 PYTHONPATH=/src/DeepEP PYTHONUNBUFFERED=1 RANK=0 "
        "WORLD_SIZE=1 python3 test_intranode.py --num-processes 2 --num-tokens 4096 --hidden 7168 --num-topk 8 --num-experts 16"
    )


def test_deepep_low_latency_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/other")
    c = deepep_own_tests.deepep_low_latency(
        TREE, Workload(hidden=7168, tokens_per_rank=128, topk=8, experts_per_rank=16), 2, python="py"
    )
    assert c.argv == ("py", "test_low_latency.py", "--num-processes", "2", "--num-tokens", "128", "--hidden", "7168",
                      "--num-topk", "8", "--num-experts", "32")  # fmt: skip
    assert c.env["PYTHONPATH"] == "/src/DeepEP:/other" and c.test == "tests/test_low_latency.py"


def test_hybrid_ep_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    tree = Path("/src/hybrid")
    wl = Workload(hidden=4096, tokens_per_rank=2048, topk=8, experts_per_rank=16)
    c = hybrid_ep_own_test.hybrid_ep(tree, wl, 2, sms=None, python="py")
    assert c.argv == ("py", "test_hybrid_ep.py", "--num-processes", "2") and c.cwd == "/src/hybrid/tests"
    assert c.env == {"PYTHONPATH": "/src/hybrid", "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "8361",
                     "WORLD_SIZE": "1", "RANK": "0", "HIDDEN_DIM": "4096", "NUM_TOKENS_PER_RANK": "2048",
                     "MAX_NUM_OF_TOKENS_PER_RANK": "2048", "NUM_LOCAL_EXPERTS": "16", "TOPK": "8"}  # fmt: skip
    with_sms = hybrid_ep_own_test.hybrid_ep(tree, wl, 2, sms=16, python="py")
    assert with_sms.env["NUM_SMS_DISPATCH"] == with_sms.env["NUM_SMS_COMBINE"] == "16"


def test_alltoall_perf_command() -> None:
    c = nccl_tests_job.alltoall_perf(Path("/nccl-tests/build/alltoall_perf"), 134217728, 2)
    assert c.argv == ("/nccl-tests/build/alltoall_perf", "-b", "134217728", "-e", "134217728", "-f", "2", "-g", "2",
                      "-d", "bfloat16", "-n", "20", "-w", "5")  # fmt: skip
    assert c.cwd is None and c.log_name == "nccl_tests_alltoall_perf_134217728.log"


def test_cases_follow_the_library_tests() -> None:
    cases = _cases(_req(backends=("deepep", "hybrid-ep", "deepep-ll", "nccl-tests"), sms=None))
    assert [(c.backend, c.workload.dtype) for c in cases] == [
        ("deepep", "bf16"), ("deepep", "fp8"), ("hybrid-ep", "bf16"), ("hybrid-ep", "fp8"), ("deepep-ll", "fp8"),
        ("nccl-tests", "bf16"), ("nccl-tests", "fp8")]  # fmt: skip
    assert cases[0].case_id == "h7168-t4096-k8-e8-uniform-s0-bf16-sm24"
    by = {(c.backend, c.workload.dtype): c for c in cases}
    assert set(by) == {("deepep", "bf16"), ("deepep", "fp8"), ("hybrid-ep", "bf16"), ("hybrid-ep", "fp8"),
                       ("deepep-ll", "fp8"), ("nccl-tests", "bf16"), ("nccl-tests", "fp8")}  # fmt: skip
    assert by[("deepep", "bf16")].sms == 24  # test_intranode.py runs 24 SMs only
    assert by[("hybrid-ep", "bf16")].sms is None and by[("deepep-ll", "fp8")].sms is None
    assert by[("deepep", "bf16")].knobs == library_way_knobs("deepep")
    assert by[("nccl-tests", "bf16")].knobs == {}
    wl = by[("hybrid-ep", "fp8")].workload
    assert (wl.hidden, wl.tokens_per_rank, wl.topk, wl.experts_per_rank) == (7168, 4096, 8, 8)
    assert by[("deepep-ll", "fp8")].workload.tokens_per_rank == 4096  # the flags, not the kernels' own
    assert _cases(_req(backends=("hybrid-ep",), sms=16))[0].sms == 16


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"backends": ("deepep", "uccl")}, "verify knows no backend 'uccl'"),
        ({"dtypes": ("mxfp8",)}, "verify compares payloads"),
        ({"sms": 16}, "runs 24 SMs only"),
    ],
)
def test_request_errors(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _req(**kw).validate()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"backends": ()}, "names no backend"),
        ({"backends": ("nccl-tests", "nccl-tests")}, "names nccl-tests more than once"),
        ({"hidden": 0}, "hidden must be a positive integer"),
        ({"tokens_per_rank": 1 << 21}, "tokens-per-rank 2097152 is above"),
        ({"backends": ("hybrid-ep",), "sms": -4}, "sms must be a whole number from 1 to 1,024"),
        ({"topk": 9, "experts_per_rank": 2}, "topk 9 > total experts 4"),
    ],
)
def test_the_planner_refuses_what_a_run_would(kw: dict[str, object], message: str) -> None:
    req = _req(**kw)
    req.validate()  # nothing verify-specific is wrong: the checks are plan_run's
    with pytest.raises(SpecError, match=message):
        _cases(req)


def test_unsupported_configurations() -> None:
    # DeepEP V1 intranode traps at hidden 8192 BF16 (DeepEP#722), and its test always runs BF16, even for fp8 only
    for dtypes in (("bf16",), ("fp8",)):
        reason = unsupported_reason("deepep", _req(hidden=8192, dtypes=dtypes), 2, 2)
        assert reason and "DeepEP#722" in reason and reason.startswith("tests/test_intranode.py cannot run")
    assert unsupported_reason("deepep", _req(hidden=7168), 2, 2) is None
    assert unsupported_reason("hybrid-ep", _req(hidden=8192), 2, 2) is None
    # Hybrid-EP's test always runs FP8 too: hidden must be a multiple of 512
    assert "divisible by 512" in (
        unsupported_reason("hybrid-ep", _req(hidden=7040, dtypes=("bf16",)), 2, 2) or ""
    )
    assert "got 3072" in (unsupported_reason("deepep-ll", _req(hidden=3072), 2, 2) or "")
    assert unsupported_reason("nccl-tests", _req(hidden=8192), 2, 2) is None


def test_expected_figures() -> None:
    deepep = expected("deepep", _req(dtypes=("fp8",)))
    assert [(e.op, e.library_dtype, e.moelab_dtype, e.figure) for e in deepep] == [
        ("dispatch", "fp8", "fp8", "deepep_nvl"), ("combine", "bf16", "fp8", "deepep_nvl"),
    ]  # fmt: skip
    hybrid = expected("hybrid-ep", _req())
    assert {e.figure for e in hybrid} == {"hybrid_ep_rank0_bytes_over_mean_time"} and len(hybrid) == 4
    assert {e.figure for e in expected("nccl-tests", _req(dtypes=("bf16",)))} == {"nccl_algbw", "nccl_busbw"}
    assert [e.timing for e in expected("deepep-ll", _req())] == ["api", "kernel", "kernel"]


def test_judge_examples() -> None:
    assert judge(241.1, 176.5, 0.05) == (pytest.approx(176.5 / 241.1), "fail")  # issue 13's 0.73
    assert judge(332.16, 327.6, 0.05) == (pytest.approx(327.6 / 332.16), "pass")
    assert judge(None, 300.0, 0.05) == (None, "error")
    assert judge(0.0, 300.0, 0.05) == (None, "error")
    assert judge(300.0, None, 0.05) == (None, "missing")
    assert judge(300.0, float("nan"), 0.05) == (None, "missing")
    assert {"fail", "error", "missing"} == FAILING


@given(
    lib=st.floats(min_value=1e-3, max_value=1e4),
    ratio=st.floats(min_value=0.01, max_value=10.0),
    tol=st.floats(min_value=0.001, max_value=0.5),
)
def test_judge_passes_exactly_within_tolerance(lib: float, ratio: float, tol: float) -> None:
    got, verdict = judge(lib, lib * ratio, tol)
    assert got == pytest.approx(ratio)
    assert verdict == ("pass" if abs(got - 1.0) <= tol else "fail")  # type: ignore[operator]
