"""plan_run: every user error is one SpecError before anything launches; the first command works."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.errors import SpecError
from moelab.plan.planning import HostFacts, RunRequest, plan_run
from moelab.suites.loader import Suite

CPU = HostFacts(cuda_devices=0)


def _plan(**kw: object) -> object:
    return plan_run(RunRequest(**kw), CPU, new_run_id="r1")  # type: ignore[arg-type]


def _suite(tmp_path: Path, text: str) -> str:
    """A small suite; `text` lines before any table header land at the top level."""
    top, _, tables = text.partition("[") if not text.startswith("[") else ("", "", text[1:])
    path = tmp_path / "s.toml"
    path.write_text(f'name = "t"\n{top}[workload]\nhidden = 256\ntokens_per_rank = 16\ntopk = 2\nexperts_per_rank = 2\n'
                    + (f"[{tables}" if tables else ""))  # fmt: skip
    return str(path)


def test_first_command_uses_the_nearest_variant_and_says_so() -> None:
    planned = _plan()
    assert planned.notes and "8 experts/rank" in planned.notes[0]  # type: ignore[attr-defined]
    spec = planned.spec  # type: ignore[attr-defined]
    assert {c.workload.experts_per_rank for c in spec.cases} == {8}
    assert spec.notes == planned.notes  # type: ignore[attr-defined]


def test_explicit_experts_per_rank_is_never_overridden() -> None:
    with pytest.raises(SpecError, match="topk 8 > total experts 4"):
        _plan(workload={"experts_per_rank": [2]})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"workload": {"hidden": [99999999999999]}}, "hidden 99999999999999 is above"),
        ({"workload": {"hidden": [0]}}, "hidden must be a positive integer"),
        ({"gpus": 0}, "--gpus must be > 0"),
        ({"timeout_s": -1.0}, "--timeout must be > 0"),
        ({"timeout_s": float("nan")}, "--timeout must be a finite number"),
        ({"timeout_s": 1e-300}, "--timeout 1e-300 is below the least this moelab waits, 1 s"),
        ({"collective_timeout_s": 0.5}, "--collective-timeout 0.5 is below the least"),
        ({"iters": 0}, "--iters must be > 0"),
        ({"warmup": -1}, "--warmup must be >= 0"),
        ({"noise_target": 2.0}, "--noise-target must be between 0 and 1"),
        ({"backends": ("nccl-a2a", "nccl-a2a")}, "names nccl-a2a more than once"),
        ({"backends": ("nosuch",)}, "unknown backend 'nosuch'"),
        ({"run_id": "../../escaped-run"}, "not a plain name"),
        ({"label": "\x1b[31mRED"}, "holds control characters"),
        ({"trace": "perf"}, "unknown --trace"),
        ({"cases": ["nope"]}, "no case 'nope'"),
    ],
)
def test_bad_flags_are_one_spec_error(kw: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        _plan(**kw)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("axes = 5\n", r"\[axes\] must be a table"),
        ('[backend.nccl-a2a.axes]\nlayuot = ["cached"]\n', "unknown knob.*layuot"),
        ("[backend.nosuch.axes]\nx = [1]\n", r"\[backend.nosuch\] names no known backend"),
        ("[axes]\nhidden = [1e12]\n", "hidden must be a positive integer"),
        ('[backend.mxfp8-a2a.axes]\nrounding = ["sideways"]\n', "rounding"),
    ],
)
def test_bad_suites_are_one_spec_error(tmp_path: Path, text: str, match: str) -> None:
    backends = ("mxfp8-a2a",) if "mxfp8" in text else ("nccl-a2a",)
    with pytest.raises(SpecError, match=match):
        _plan(suite=_suite(tmp_path, text), backends=backends)


def test_a_payload_a_backend_lacks_is_an_unsupported_case_not_an_error() -> None:
    """`--dtype bf16,fp8` over nccl-a2a and mxfp8-a2a (neither has fp8): planned, the fp8 cases unsupported
    at run time, as seen on the GPU machine where the knob check once refused the whole run."""
    planned = _plan(backends=("nccl-a2a", "mxfp8-a2a"), workload={"dtype": ["bf16", "fp8"]})
    assert {(c.backend, c.workload.dtype) for c in planned.spec.cases} >= {
        ("mxfp8-a2a", "fp8"),
        ("nccl-a2a", "fp8"),
    }  # type: ignore[attr-defined]


def test_the_e2e_suite_plans_and_its_own_knobs_are_checked(tmp_path: Path) -> None:
    planned = _plan(suite="e2e", backends=("nccl-a2a",), workload={"experts_per_rank": [8]})
    assert {c.e2e.mode for c in planned.spec.cases if c.e2e} == {"serial", "tbo"}
    bad = '[backend.nccl-a2a.axes]\nbench = ["e2e"]\nmode = ["sideways"]\n'
    with pytest.raises(SpecError, match="mode"):
        _plan(suite=_suite(tmp_path, bad), backends=("nccl-a2a",))


def test_knobs_of_each_backend_are_checked_by_its_class(tmp_path: Path) -> None:
    ok = _plan(
        suite=_suite(tmp_path, '[backend.mxfp8-a2a.axes]\nrounding = ["floor", "rceil"]\n'),
        backends=("mxfp8-a2a",),
    )
    assert {c.knobs["rounding"] for c in ok.spec.cases} == {"floor", "rceil"}  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    hidden=st.one_of(
        st.integers(min_value=-(2**40), max_value=0), st.integers(min_value=2**19, max_value=2**62)
    ),
    iters=st.one_of(st.none(), st.integers(max_value=0)),
)
def test_generated_junk_flags_never_get_through(hidden: int, iters: int | None) -> None:
    with pytest.raises(SpecError):
        _plan(workload={"hidden": [hidden]}, iters=iters)


def test_an_inline_suite_gives_its_explicit_cases_in_order() -> None:
    """verify and tune plan runs of explicit cases (a backend's SMs, payload and knobs per case) this way."""
    suite = Suite(name="inline", description="", workload={"hidden": 256, "tokens_per_rank": 16, "topk": 2,
                  "experts_per_rank": 2}, axes={}, source="inline",
                  cases=({"backend": "mxfp8-a2a", "sms": 8}, {"backend": "nccl-a2a", "dtype": "fp8"}, {"backend": "mxfp8-a2a"}))  # fmt: skip
    spec = _plan(suite=suite, backends=("nccl-a2a", "mxfp8-a2a"), workload={"tokens_per_rank": [32]}).spec  # type: ignore[attr-defined]
    assert spec.suite == "inline"
    assert [(c.backend, c.sms, c.workload.dtype, c.workload.tokens_per_rank) for c in spec.cases] == [
        ("mxfp8-a2a", 8, "bf16", 32), ("nccl-a2a", None, "fp8", 32), ("mxfp8-a2a", None, "bf16", 32)
    ]  # fmt: skip
    with pytest.raises(SpecError, match="names backend 'deepep', not one of this run's"):
        _plan(suite=dataclasses.replace(suite, cases=({"backend": "deepep"},)), backends=("nccl-a2a",))
    with pytest.raises(SpecError, match="unknown knob.*layuot"):
        _plan(suite=dataclasses.replace(suite, cases=({"backend": "nccl-a2a", "layuot": "cached"},)))
