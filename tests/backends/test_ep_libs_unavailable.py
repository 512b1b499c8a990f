"""nccl-ep and uccl-ep on a host without their packages or GPUs: exact one-line reasons, listed by
`moelab backends`; the version and wrapper rules on fake packages; the padded-dispatch helpers they share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from moelab.backends import nccl_ep, registry, uccl_ep
from moelab.backends.padded import PaddedDispatched, pad_rows, received_rows
from moelab.cli.main import app

NEW = ("torch-symm-a2a", "nccl-ep", "uccl-ep")


def _rows_by_backend(stdout: str) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.count("│") < 4:
            continue
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[0]:
            current = cells[0]
            rows[current] = cells
        elif current is not None:  # a folded reason continues on the next line
            rows[current][2] += " " + cells[2]
    return rows


def test_backends_lists_the_new_backends_with_their_reasons() -> None:
    result = CliRunner().invoke(app, ["backends"])
    assert result.exit_code == 0, result.output
    rows = _rows_by_backend(result.stdout)
    for name in NEW:
        assert name in rows and rows[name][3] == "builtin"
        reason = registry.availability(name)
        if reason is None:
            assert rows[name][1] == "available"
        else:
            assert rows[name][1] == "unavailable" and "\n" not in reason
            assert " ".join(rows[name][2].split())[:30] == " ".join(reason.split())[:30]


def _fake_package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def clean_modules(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(sys.modules):
        if name in ("nccl", "uccl", "deep_ep") or name.startswith(("nccl.", "uccl.", "deep_ep.")):
            monkeypatch.delitem(sys.modules, name)
    return monkeypatch


def test_nccl_ep_missing_package_names_the_wheel() -> None:
    if nccl_ep._nccl_ep_problem() is None or "not installed" not in (nccl_ep._nccl_ep_problem() or ""):
        pytest.skip("nccl.ep is installed here")
    assert nccl_ep._nccl_ep_problem() == (
        "nccl-extensions not installed (pip install nccl-extensions==0.1.0): No module named 'nccl'"
    )


def test_nccl_ep_import_failure_is_reported_exactly(
    tmp_path: Path, clean_modules: pytest.MonkeyPatch
) -> None:
    _fake_package(tmp_path, {"nccl/ep/__init__.py": "import cuda.bindings_missing_for_test\n"})
    clean_modules.syspath_prepend(str(tmp_path))
    reason = nccl_ep.NcclEPBackend.availability()
    assert reason == "import nccl.ep failed: ModuleNotFoundError: No module named 'cuda'" or (
        reason is not None and reason.startswith("import nccl.ep failed:") and "cuda" in reason
    )


def test_nccl_ep_reports_the_nccl_it_found(tmp_path: Path, clean_modules: pytest.MonkeyPatch) -> None:
    _fake_package(
        tmp_path,
        {
            "nccl/ep/__init__.py": "",
            "nccl/core/__init__.py": (
                "from types import SimpleNamespace as NS\n"
                "def get_version():\n"
                "    return NS(libnccl=NS(version='2.28.9', path='/site/nvidia/nccl/lib/libnccl.so.2'))\n"
            ),
        },
    )
    clean_modules.syspath_prepend(str(tmp_path))
    clean_modules.setattr(torch.cuda, "is_available", lambda: True)
    clean_modules.setattr(nccl_ep, "_torch_nccl_version", lambda: "2.28.9")
    reason = nccl_ep.NcclEPBackend.availability()
    assert reason == (
        "NCCL 2.28.9 at /site/nvidia/nccl/lib/libnccl.so.2 is too old: NCCL EP needs >= 2.30.7 "
        "(pip install nvidia-nccl-cu13==2.30.7 and load its libnccl.so.2); torch's NCCL is 2.28.9"
    )


def test_nccl_ep_without_gpu(tmp_path: Path, clean_modules: pytest.MonkeyPatch) -> None:
    _fake_package(tmp_path, {"nccl/ep/__init__.py": ""})
    clean_modules.syspath_prepend(str(tmp_path))
    clean_modules.setattr(torch.cuda, "is_available", lambda: False)
    assert nccl_ep.NcclEPBackend.availability() == "no CUDA GPU (NCCL EP runs on CUDA devices)"


@pytest.mark.parametrize(
    ("found", "ok"),
    [((2, 30, 7), True), ((2, 31, 0), True), ((3, 0, 0), True), ((2, 30, 6), False), ((2, 28, 9), False)],
)
def test_nccl_version_rule(found: tuple[int, ...], ok: bool) -> None:
    assert (nccl_ep.nccl_version_problem(found, None, None) is None) == ok


def test_nccl_version_rule_without_a_library() -> None:
    reason = nccl_ep.nccl_version_problem(None, None, "2.28.9")
    assert reason is not None and "no libnccl" in reason and "2.28.9" in reason


@pytest.mark.parametrize(
    ("text", "want"), [("2.30.7", (2, 30, 7)), ("2.32.3+cuda13.0", (2, 32, 3)), ("2.28.9", (2, 28, 9))]
)
def test_parse_version(text: str, want: tuple[int, ...]) -> None:
    assert nccl_ep.parse_version(text) == want


def test_nccl_ep_counts_vector_sums_to_the_total() -> None:
    counts = nccl_ep.recv_counts_of(torch.tensor([37], dtype=torch.int32), 4)
    assert counts.tolist() == [37, 0, 0, 0]


def test_uccl_missing_package() -> None:
    reason = uccl_ep._uccl_problem()
    if reason is None or "not installed" not in reason:
        pytest.skip("uccl is installed here")
    assert reason == "uccl not installed (pip install uccl==0.1.1)"


def test_uccl_load_failure_is_reported_exactly(tmp_path: Path, clean_modules: pytest.MonkeyPatch) -> None:
    message = "libcudart.so.12: cannot open shared object file: No such file or directory"
    _fake_package(
        tmp_path, {"uccl/__init__.py": "", "uccl/ep.py": f"raise ImportError({message!r}, name='uccl.ep')\n"}
    )
    clean_modules.syspath_prepend(str(tmp_path))
    clean_modules.setattr(uccl_ep, "find_cudart12", lambda paths=None: None)
    assert uccl_ep.UcclEPBackend.availability() == (
        f"import uccl.ep failed: {message} (pip install nvidia-cuda-runtime-cu12 supplies it)"
    )


def test_uccl_other_load_failures_have_no_cudart_hint(
    tmp_path: Path, clean_modules: pytest.MonkeyPatch
) -> None:
    message = "libibverbs.so.1: cannot open shared object file: No such file or directory"
    _fake_package(
        tmp_path, {"uccl/__init__.py": "", "uccl/ep.py": f"raise ImportError({message!r}, name='uccl.ep')\n"}
    )
    clean_modules.syspath_prepend(str(tmp_path))
    assert uccl_ep.UcclEPBackend.availability() == f"import uccl.ep failed: {message}"


def test_find_cudart12(tmp_path: Path) -> None:
    assert uccl_ep.find_cudart12([str(tmp_path)]) is None
    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert uccl_ep.find_cudart12(["/nonexistent", str(tmp_path)]) == lib


def test_uccl_needs_its_wrapper_not_deepep(tmp_path: Path, clean_modules: pytest.MonkeyPatch) -> None:
    _fake_package(
        tmp_path,
        {
            "uccl/__init__.py": "",
            "uccl/ep.py": "",
            "deep_ep/__init__.py": "from .buffer import Buffer\n",
            "deep_ep/buffer.py": "import deep_ep_cpp\nclass Buffer:\n    pass\n",
        },
    )
    clean_modules.syspath_prepend(str(tmp_path))
    reason = uccl_ep.UcclEPBackend.availability()
    assert reason is not None and "is DeepEP itself, not UCCL's wrapper" in reason


def test_uccl_wrapper_rule(tmp_path: Path) -> None:
    assert uccl_ep.wrapper_problem(None) is not None
    assert "--backend-path uccl-ep=" in (uccl_ep.wrapper_problem(None) or "")
    _fake_package(tmp_path, {"deep_ep/__init__.py": "", "deep_ep/buffer.py": "from uccl import ep\n"})
    assert uccl_ep.wrapper_problem(str(tmp_path / "deep_ep" / "__init__.py")) is None


def test_received_rows_trims_padded_results_only() -> None:
    x = torch.arange(12.0).view(6, 2)
    idx = torch.zeros(6, 1, dtype=torch.int64)
    d = PaddedDispatched(
        recv_x=x,
        recv_topk_idx=idx,
        recv_topk_weights=idx.float(),
        handle=None,
        recv_counts=torch.tensor([2, 1]),
    )
    got = received_rows(d)
    assert got.num_rows == 3 and torch.equal(got.recv_x, x[:3]) and d.capacity == 6
    padded = pad_rows(torch.ones(3, 2), d)
    assert padded.shape == (6, 2) and padded[3:].abs().sum() == 0
    plain = received_rows(got)
    assert plain is got and pad_rows(x, got) is x


def _nccl_h(root: Path, version: tuple[int, int, int]) -> Path:
    header = root / "include" / "nccl.h"
    header.parent.mkdir(parents=True)
    major, minor, patch = version
    header.write_text(
        f"#define NCCL_H_\n#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        f'#define NCCL_SUFFIX ""\n#define NCCL_VERSION_CODE {major * 10000 + minor * 100 + patch}\n'
    )
    return header


def test_header_version() -> None:
    text = (
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 30\n#define NCCL_PATCH 7\n#define NCCL_VERSION_CODE 23007\n"
    )
    assert nccl_ep.header_version(text) == (2, 30, 7)
    assert nccl_ep.header_version("#define NCCL_MAJOR 2\n#define NCCL_MINOR 30\n") is None


def test_jit_headers_rule(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    header = _nccl_h(old, (2, 28, 9))
    _nccl_h(new, (2, 30, 7))
    assert nccl_ep.jit_headers_problem(str(new), (2, 30, 7)) is None
    assert nccl_ep.jit_headers_problem(str(new), (2, 30, 9)) is None  # a patch release shares its headers
    assert nccl_ep.jit_headers_problem(None, (2, 30, 7)) is None
    assert nccl_ep.jit_headers_problem(str(tmp_path / "absent"), (2, 30, 7)) is None
    assert nccl_ep.jit_headers_problem(str(old), (2, 30, 7)) == (
        f"nccl.ep compiles its kernels against NCCL 2.28.9 headers ({header}) but the loaded libnccl is 2.30.7: "
        "set NCCL_HOME to that libnccl's own install (its include/ and lib/) before starting"
    )


@pytest.mark.parametrize(("headers", "ok"), [((2, 30, 7), True), ((2, 28, 9), False)])
def test_nccl_ep_checks_the_headers_its_jit_uses(
    tmp_path: Path, clean_modules: pytest.MonkeyPatch, headers: tuple[int, int, int], ok: bool
) -> None:
    _fake_package(
        tmp_path / "site",
        {
            "nccl/ep/__init__.py": "",
            "nccl/core/__init__.py": (
                "from types import SimpleNamespace as NS\n"
                "def get_version():\n"
                "    return NS(libnccl=NS(version='2.30.7', path='/opt/nccl/lib/libnccl.so.2'))\n"
            ),
        },
    )
    _nccl_h(tmp_path / "home", headers)
    clean_modules.syspath_prepend(str(tmp_path / "site"))
    clean_modules.setenv("NCCL_HOME", str(tmp_path / "home"))
    clean_modules.setattr(torch.cuda, "is_available", lambda: True)
    clean_modules.setattr(nccl_ep, "_torch_nccl_version", lambda: "2.28.9")
    reason = nccl_ep.NcclEPBackend.availability()
    assert (reason is None) == ok
    if not ok:
        assert reason is not None and reason.startswith(
            "nccl.ep compiles its kernels against NCCL 2.28.9 headers"
        )
