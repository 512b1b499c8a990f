"""The store owns its schema: no module in a layer below `store` (as .importlinter orders them) names one of
the store's tables or views in SQL; what health needs of the history it gets through moelab.store."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

from moelab.store.db import connect

ROOT = Path(__file__).resolve().parents[2]
# SQL here is written in capitals; prose ("into cases", "table measured_rates") is not SQL
SQL_NAME = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE|VIEW)\s+([A-Za-z_]\w*)")


def _layers_below_store() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = [
        line.strip() for line in config["importlinter:contract:layers"]["layers"].splitlines() if line.strip()
    ]
    below = layers[layers.index("store") + 1 :]
    return [name.strip() for layer in below for name in layer.split("|")]


def _store_names(tmp_path: Path) -> set[str]:
    con = connect(tmp_path / "schema.duckdb")
    try:
        rows = con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    finally:
        con.close()
    return {r[0].lower() for r in rows}


def _strings(path: Path) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def store_tables_named_below_store(root: Path, tables: set[str]) -> list[str]:
    found = []
    for package in _layers_below_store():
        base = root / "moelab" / package
        module = base.with_suffix(".py")
        for path in sorted(base.rglob("*.py")) if base.is_dir() else [module] if module.exists() else []:
            for line, text in _strings(path):
                named = {m.lower() for m in SQL_NAME.findall(text)} & tables
                found += [f"{path.relative_to(root)}:{line}: {t}" for t in sorted(named)]
    return found


def test_no_module_below_the_store_names_a_store_table(tmp_path: Path) -> None:
    tables = _store_names(tmp_path)
    assert {"runs", "results", "environment", "cases_judged"} <= tables
    assert store_tables_named_below_store(ROOT, tables) == []


def test_the_scan_finds_a_query_below_the_store(tmp_path: Path) -> None:
    """The scan is no decoration: health asking `results` itself, as drift did, is found."""
    copy = tmp_path / "tree"
    (copy / "moelab" / "health").mkdir(parents=True)
    (copy / "moelab" / "health" / "peek.py").write_text(
        'def peek(con):\n    return con.execute("SELECT median_us FROM results r JOIN runs USING (run_id)")\n'
    )
    found = store_tables_named_below_store(copy, _store_names(tmp_path))
    assert found == ["moelab/health/peek.py:2: results", "moelab/health/peek.py:2: runs"]
