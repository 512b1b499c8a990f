"""A synthetic published table, written as a `published_tables` file parses: one H100 dataset of 8 GPUs and 8
ConnectX-7 per node, one table `t` whose fields a test sets where they matter to it."""

from __future__ import annotations

from typing import Any


def dataset(table: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "dataset": {
            "library": "L",
            "version": "v1",
            "repository": "https://github.com/x/y",
            "hardware_text": "h",
            "gpu": "H100",
            "nic": "ConnectX-7",
            "gpus_per_node": 8,
            "nics_per_node": 8,
        },
        "tables": {
            "t": {
                "title": "T",
                "document": "README.md",
                "commit": "0" * 40,
                "date": "2026-01-01",
                "figure": "f",
                "test": "t",
                "workload_text": "w",
                **table,
            }
        },
        "rows": rows,
    }
