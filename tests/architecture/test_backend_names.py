"""What a library knows lives beside its backend: no module outside moelab/backends names a built-in
backend in its code (a string in a comparison, a table of names, a default, SQL), so a plugin backend is
run, verified and tuned like a built-in one. Docstrings may name them; so may the few texts below, each
byte-for-byte what moelab stores or prints."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from moelab.backends.registry import BUILTIN

PACKAGE = Path(__file__).resolve().parents[2] / "moelab"
# (module, backend name): why the text may name it
ALLOWED = {
    (
        "core/definitions.py",
        "nccl-tests",
    ): "the definitions of nccl-tests' own figures name the tool, stored as written",
    (
        "core/definitions.py",
        "mxfp8-a2a",
    ): "the MXFP8 payload's stored definition names the backend that sends it",
    ("store/schema.py", "nccl-tests"): "migration 2's description, stored in schema_version: history",
    ("cli/trace.py", "nccl-a2a"): "an example run-directory path in `moelab trace --help`",
}
NAME = {name: re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])") for name in BUILTIN}


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }


def named_backends(source: str) -> list[tuple[int, str]]:
    """(line, backend) for each string in the code (docstrings aside) that names a built-in backend."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        (node.lineno, name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        for name, pattern in NAME.items()
        if pattern.search(node.value)
    ]


def test_no_module_outside_the_backends_names_a_built_in_backend() -> None:
    found = {
        (path.relative_to(PACKAGE).as_posix(), line, name)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "backends"
        for line, name in named_backends(path.read_text())
    }
    assert sorted(f for f in found if (f[0], f[2]) not in ALLOWED) == []
    assert {(f[0], f[2]) for f in found} == set(ALLOWED)  # no allowance outlives its text


def test_the_check_sees_names_in_code_and_not_in_docstrings() -> None:
    code = '''"""Runs deepep."""
def f(backend):
    """Says nccl-a2a."""
    sql = "SELECT * FROM results WHERE backend <> 'nccl-tests'"
    return backend == "hybrid-ep" or f"{backend}" in ("deepep-ll", "my-nccl-a2a-fork")
'''
    assert sorted(named_backends(code)) == [(4, "nccl-tests"), (5, "deepep-ll"), (5, "hybrid-ep")]
