"""Suite files: built-ins load, axes expand to their cartesian product, CLI overrides replace axes,
[[exclude]] drops cases, invalid combinations become skipped cases, bad files give one-line SpecErrors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from moelab.core.errors import SpecError
from moelab.suites.loader import builtin_suites, expand, load_suite, parse_suite

BASE = """
name = "t"
[workload]
hidden = 128
tokens_per_rank = 16
topk = 2
experts_per_rank = 2
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def _spec_error(path_or_text: Path | str, tmp_path: Path) -> str:
    path = path_or_text if isinstance(path_or_text, Path) else _write(tmp_path, path_or_text)
    with pytest.raises(SpecError) as info:
        load_suite(str(path))
    msg = str(info.value)
    assert msg and "\n" not in msg, msg
    return msg


def test_builtin_suites_load_and_expand() -> None:
    names = builtin_suites()
    assert {"dispatch-combine", "routings", "tokens", "e2e"} <= set(names)
    for name in names:
        suite = load_suite(name)
        assert suite.name and suite.source.endswith(f"{name}.toml")
        cases = expand(suite, ["nccl-a2a"], world=8)
        if name != "e2e" or "nccl-a2a" in suite.backend_axes:
            assert cases, name
        assert len({c.case_id for c in cases}) == len(cases)


def test_reference_suite_is_the_design_workload() -> None:
    cases = expand(load_suite("dispatch-combine"), ["nccl-a2a"], world=8)
    assert [c.sms for c in cases] == [None, 8, 16, 24, 32]
    wl = cases[0].workload
    assert (wl.hidden, wl.tokens_per_rank, wl.topk, wl.experts_per_rank, wl.routing.kind, wl.dtype) == (
        8192, 4096, 8, 2, "uniform", "bf16",
    )  # fmt: skip
    # 2 experts/rank x 2 ranks < topk 8: every case is kept, each as skipped with the reason
    two = expand(load_suite("dispatch-combine"), ["nccl-a2a"], world=2)
    assert len(two) == 5 and all(c.skip_reason and "topk 8 > total experts 4" in c.skip_reason for c in two)


def test_expansion_is_the_product_of_axes(tmp_path: Path) -> None:
    suite = load_suite(
        str(_write(tmp_path, BASE + '[axes]\nhidden = [128, 256]\nsms = ["default", 8, 16]\nseed = [0, 1]\n'))
    )
    cases = expand(suite, ["nccl-a2a", "mxfp8-a2a"], world=2)
    assert len(cases) == 2 * 2 * 3 * 2
    got = {(c.backend, c.workload.hidden, c.sms, c.workload.routing.seed) for c in cases}
    assert got == set(itertools.product(["nccl-a2a", "mxfp8-a2a"], [128, 256], [None, 8, 16], [0, 1]))
    assert all(c.workload.tokens_per_rank == 16 and c.skip_reason is None for c in cases)


def test_overrides_replace_axes_and_base_values(tmp_path: Path) -> None:
    suite = load_suite(str(_write(tmp_path, BASE + '[axes]\nhidden = [128, 256]\nsms = ["default", 8]\n')))
    cases = expand(suite, ["nccl-a2a"], world=2, overrides={"hidden": [512], "tokens_per_rank": [4, 8, 12]})
    assert {(c.workload.hidden, c.workload.tokens_per_rank, c.sms) for c in cases} == set(
        itertools.product([512], [4, 8, 12], [None, 8])
    )


def test_exclude_drops_matching_cases(tmp_path: Path) -> None:
    text = (
        BASE + '[axes]\nhidden = [128, 256]\nsms = ["default", 8, 16]\n[[exclude]]\nhidden = 256\nsms = 8\n'
    )
    cases = expand(load_suite(str(_write(tmp_path, text))), ["nccl-a2a"], world=2)
    got = {(c.workload.hidden, c.sms) for c in cases}
    assert len(cases) == 5 and (256, 8) not in got and (128, 8) in got and (256, 16) in got


def test_invalid_combination_becomes_a_skipped_case(tmp_path: Path) -> None:
    suite = load_suite(str(_write(tmp_path, BASE + "[axes]\ntopk = [2, 4, 8]\n")))
    cases = {c.workload.topk: c for c in expand(suite, ["nccl-a2a"], world=2)}
    assert cases[2].skip_reason is None and cases[4].skip_reason is None
    reason = cases[8].skip_reason
    assert reason and "topk 8 > total experts 4" in reason and "--experts-per-rank >= 4" in reason


def test_backend_sections_override_and_add_knobs(tmp_path: Path) -> None:
    text = BASE + (
        '[axes]\nsms = ["default"]\n'
        '[backend.deepep.workload]\ndtype = "fp8"\n'
        '[backend.deepep.axes]\nmode = ["serial", "tbo"]\n'
    )
    cases = expand(load_suite(str(_write(tmp_path, text))), ["nccl-a2a", "deepep"], world=2)
    by_backend = {b: [c for c in cases if c.backend == b] for b in ("nccl-a2a", "deepep")}
    assert [(c.workload.dtype, c.knobs) for c in by_backend["nccl-a2a"]] == [("bf16", {})]
    assert sorted(c.knobs["mode"] for c in by_backend["deepep"]) == ["serial", "tbo"]
    assert all(c.workload.dtype == "fp8" for c in by_backend["deepep"])
    assert all("mode=" in c.case_id for c in by_backend["deepep"])


def test_backend_defaults_sit_below_the_suite() -> None:
    suite = parse_suite({"workload": {"hidden": 128, "topk": 2}, "axes": {"sms": ["default"]}})
    (case,) = expand(suite, ["x"], world=2, backend_defaults={"x": {"hidden": 7168, "tokens_per_rank": 128}})
    assert (case.workload.hidden, case.workload.tokens_per_rank) == (128, 128)


def test_malformed_toml(tmp_path: Path) -> None:
    msg = _spec_error('name = "t"\n[workload\nhidden = 128\n', tmp_path)
    assert msg.startswith("malformed suite file")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BASE + "[axes]\nhiden = [128]\n", "unknown axis 'hiden'"),
        (BASE + "[axes]\nhidden = []\n", "axis 'hidden' is empty"),
        ('colour = "red"\n' + BASE, "unknown suite key(s) colour"),
        (BASE + "heads = 4\n", "unknown workload key 'heads'"),
        ("exclude = 3\n" + BASE, "'exclude' must be a list of tables"),
        (BASE + "[backend.deepep]\nsms = [8]\n", "[backend.deepep] may hold only 'workload' and 'axes'"),
    ],
    ids=[
        "unknown-axis",
        "empty-axis",
        "unknown-top-key",
        "unknown-workload-key",
        "exclude-shape",
        "backend-shape",
    ],
)
def test_unknown_keys_and_bad_shapes(tmp_path: Path, text: str, needle: str) -> None:
    assert needle in _spec_error(text, tmp_path)


@pytest.mark.parametrize(
    ("value", "needle"), [("-4", "sms must be a whole number from 1 to 1,024"), ('"many"', "got 'many'")]
)
def test_bad_sms_in_axes(tmp_path: Path, value: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):  # the file is checked whole when it loads (issue 41)
        expand(load_suite(str(_write(tmp_path, BASE + f"[axes]\nsms = [{value}]\n"))), ["nccl-a2a"], world=2)


def test_bad_workload_value_type(tmp_path: Path) -> None:
    # a value no run could use is refused before anything launches (not stored as a skipped case)
    with pytest.raises(SpecError, match="hidden must be a positive integer"):
        expand(load_suite(str(_write(tmp_path, BASE + '[axes]\nhidden = ["wide"]\n'))), ["nccl-a2a"], world=2)


def test_missing_and_unreadable_suite(tmp_path: Path) -> None:
    msg = _spec_error(tmp_path / "nope.toml", tmp_path)
    assert "no suite" in msg and "dispatch-combine" in msg
    assert "not a regular file" in _spec_error(tmp_path, tmp_path)  # a folder, not a file
