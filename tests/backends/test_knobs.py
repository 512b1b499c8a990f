"""Knobs as one typed config per backend: names, checks and messages come from the declaration; every
built-in backend's knobs go through it, with the messages they had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moelab.backends import registry
from moelab.backends.base import Backend, HostJob
from moelab.backends.knobs import Knobs, knob
from moelab.core.errors import SpecError
from moelab.core.workload import Workload

WL = Workload(hidden=256, tokens_per_rank=8, topk=2, experts_per_rank=2)


@dataclass(frozen=True, kw_only=True)
class Lamp(Knobs):
    owner = "lamp"
    on: bool = knob(False, "true: light")
    watts: int | None = knob(None, "power")
    colour: str = knob(
        "white", "white | red", choices=("white", "red"), refusal="{name} must be {want}, not {value!r}"
    )

    def check(self, workload: Workload) -> None:
        if self.colour == "red" and not self.on:
            raise SpecError("lamp: red needs on = true")


def test_values_come_back_typed_and_defaults_fill_the_rest() -> None:
    assert Lamp.parse({"on": True, "watts": 40}) == Lamp(on=True, watts=40, colour="white")
    assert Lamp.parse({}).colour == "white" and Lamp.names() == ("on", "watts", "colour")
    assert Knobs.parse({}, "any") == Knobs() and Knobs.names() == ()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"wat": 1, "colur": "red"}, "lamp: unknown knob(s) colur, wat (valid knobs: colour, on, watts)"),
        ({"on": "yes"}, "lamp: on must be true or false, got 'yes'"),
        ({"watts": 0}, "lamp: watts must be a positive integer, got 0"),
        ({"watts": True}, "lamp: watts must be a positive integer, got True"),
        ({"colour": 3}, "colour must be one of white, red, not '3'"),
    ],
)
def test_bad_values_get_one_line_in_the_declared_wording(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        Lamp.parse(values)
    assert str(err.value) == message


def test_rules_between_knobs_are_the_configs_check() -> None:
    Lamp.parse({"colour": "red", "on": True}).check(WL)
    with pytest.raises(SpecError, match="red needs on"):
        Lamp.parse({"colour": "red"}).check(WL)


@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_an_int_knob_takes_exactly_the_positive_integers(value: int) -> None:
    if value > 0:
        assert Lamp.parse({"watts": value}).watts == value
    else:
        with pytest.raises(SpecError, match="positive integer"):
            Lamp.parse({"watts": value})


@pytest.mark.parametrize(
    ("backend", "knobs", "message"),
    [
        ("nccl-a2a", {"nope": 1}, "nccl-a2a: unknown knob(s) nope (valid knobs: exchange)"),
        ("nccl-a2a", {"exchange": "ring"}, "exchange must be one of auto, splits, allgather, not 'ring'"),
        (
            "deepep",
            {"chunk": 1},
            "deepep: unknown knob(s) chunk (knobs: fp8_cast, nvl_chunk, nvl_buffer, "
            "rdma_chunk, rdma_buffer, combine_nvl_chunk, combine_rdma_chunk)",
        ),
        ("deepep", {"fp8_cast": 3}, "deepep: fp8_cast must be one of outside, inside, got '3'"),
        ("uccl-ep", {"nvl_chunk": 0}, "deepep: nvl_chunk must be a positive integer, got 0"),
        ("hybrid-ep", {"fused": "yes"}, "hybrid-ep: fused must be true or false, got 'yes'"),
        (
            "mxfp8-a2a",
            {"rounding": "nearest"},
            "unknown MXFP8 scale rounding 'nearest': choose one of rceil, floor, ceil, even",
        ),
        ("mxfp8-a2a", {"quantizer": "x"}, "mxfp8-a2a: quantizer must be one of auto, torch, triton, torchao"),
        (
            "mxfp8-a2a",
            {"dispatch_impl": "mxfp8"},
            "mxfp8-a2a: dispatch_impl mxfp8 contradicts the workload dtype "
            "bf16: set the workload dtype to mxfp8 instead",
        ),
        ("deepep-ll", {"x": 1}, "deepep-ll: unknown knob(s) x (valid knobs: none)"),
        ("nccl-tests", {"x": 1}, "nccl-tests: unknown knob(s) x (valid knobs: none)"),
    ],
)
def test_built_in_knobs_keep_their_messages(backend: str, knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        registry.load(backend).check_knobs(knobs, WL)
    assert str(err.value) == message


def test_every_built_in_takes_its_own_defaults() -> None:
    for name in registry.BUILTIN:
        cls = registry.load(name)
        assert issubclass(cls, Backend | HostJob)
        defaults = cls.knobs()
        given_all = {n: getattr(defaults, n) for n in cls.knobs.names() if getattr(defaults, n) is not None}
        cls.check_knobs(
            given_all, Workload(hidden=256, tokens_per_rank=8, topk=2, experts_per_rank=2, dtype="bf16")
        )
