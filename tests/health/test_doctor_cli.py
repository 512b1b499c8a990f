"""`moelab doctor` through CliRunner, mounted on a small typer app over recorded device states."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from moelab.cli.doctor import build_doctor, doctor
from moelab.health.model import HealthSnapshot
from tests.fixtures.health.fake_nvml import recorded_snapshot

runner = CliRunner()


def app_over(
    tmp_path: Path, nvml_state: str, sysfs: str | None = None, lspci: str | None = None
) -> typer.Typer:
    """A typer app whose `doctor` probes a recorded node instead of this machine."""
    seen: dict[str, Any] = {}

    def take(**kwargs: Any) -> HealthSnapshot:
        seen.update(kwargs)
        return recorded_snapshot(
            tmp_path, nvml_state, sysfs, lspci, host="gpu-node-7", load_ms=kwargs["load_ms"]
        )

    app = typer.Typer()
    app.command("doctor")(build_doctor(take))

    @app.command("noop")
    def noop() -> None:
        """Keeps typer from collapsing the single command into the app."""

    app.seen = seen  # type: ignore[attr-defined]
    return app


def test_healthy_node_exit_zero_with_table(tmp_path: Path) -> None:
    app = app_over(tmp_path, "healthy_h200x2", "dgx_h200x2", "cx7_h200x2")
    result = runner.invoke(app, ["doctor", "--load-ms", "250"])
    assert result.exit_code == 0, result.output
    assert "gpu-node-7" in result.output and "clock_under_load" in result.output
    assert "worst: warn (0 fail, 1 warn) over 1 node(s)" in result.output
    assert app.seen["load_ms"] == 250  # type: ignore[attr-defined]


def test_strict_turns_warnings_into_exit_one(tmp_path: Path) -> None:
    result = runner.invoke(
        app_over(tmp_path, "healthy_h200x2", "dgx_h200x2", "cx7_h200x2"), ["doctor", "--strict"]
    )
    assert result.exit_code == 1


def test_throttled_node_exits_one_and_says_why(tmp_path: Path) -> None:
    result = runner.invoke(app_over(tmp_path, "throttled_h200x2"), ["doctor"])
    assert result.exit_code == 1
    assert "throttled: 1110 MHz" in result.output
    assert "fail" in result.output


def test_json_output_and_save_then_compare_nodes(tmp_path: Path) -> None:
    saved = tmp_path / "sick.json"
    result = runner.invoke(app_over(tmp_path, "ecc_error_h200x2"), ["doctor", "--json", "--save", str(saved)])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["worst"] == "fail"
    assert report["nodes"][0]["host"] == "gpu-node-7"
    assert any(f["check"] == "ecc" and f["status"] == "fail" and f["source"] for f in report["findings"])
    assert not any("seed" in f["source"].lower() for f in report["findings"])  # public sources only
    assert HealthSnapshot.from_dict(json.loads(saved.read_text())).host == "gpu-node-7"

    healthy = tmp_path / "healthy.json"
    healthy.write_text(json.dumps(recorded_snapshot(tmp_path, "healthy_h200x2", host="gpu-node-1").to_dict()))
    throttled = tmp_path / "throttled.json"
    throttled.write_text(
        json.dumps(recorded_snapshot(tmp_path, "throttled_h200x2", host="gpu-node-2").to_dict())
    )
    merged = runner.invoke(
        doctor_app(),
        ["doctor", "--json", "--from", str(healthy), "--from", str(throttled), "--from", str(saved)],
    )
    assert merged.exit_code == 1
    out = json.loads(merged.output)
    assert [n["host"] for n in out["nodes"]] == ["gpu-node-1", "gpu-node-2", "gpu-node-7"]
    slowest = [f for f in out["cluster"] if f["check"] == "slowest_gpu"]
    assert [(f["host"], f["subject"]) for f in slowest] == [("gpu-node-2", "gpu1")]
    # a doctor --json report is itself a valid --from input
    report_file = tmp_path / "report.json"
    report_file.write_text(merged.output)
    again = runner.invoke(doctor_app(), ["doctor", "--from", str(report_file)])
    assert (
        again.exit_code == 1
        and "across GPUs and nodes: warn" in again.output
        and "throttling_node" in again.output
    )


def doctor_app() -> typer.Typer:
    app = typer.Typer()
    app.command("doctor")(doctor)

    @app.command("noop")
    def noop() -> None:
        """Keeps typer from collapsing the single command into the app."""

    return app


def test_bad_from_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "hostname": "x"}))
    result = runner.invoke(doctor_app(), ["doctor", "--from", str(bad)])
    assert result.exit_code == 2
    assert "is not a health snapshot" in result.output
    missing = runner.invoke(doctor_app(), ["doctor", "--from", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_a_from_file_of_no_snapshot_is_no_pass(tmp_path: Path) -> None:
    """`[]` or a report of no node was judged as `worst: pass ... over 0 node(s)`, exit 0."""
    for i, body in enumerate(([], {"nodes": []})):
        empty = tmp_path / f"empty{i}.json"
        empty.write_text(json.dumps(body))
        result = runner.invoke(doctor_app(), ["doctor", "--strict", "--from", str(empty)])
        assert result.exit_code == 2, result.output
        assert (
            result.output
            == f"error: {empty} is not a health snapshot or doctor report: it holds no snapshot\n"
        )


def test_one_snapshot_given_twice_is_refused_not_judged_as_two_nodes(tmp_path: Path) -> None:
    """The same file twice, or a report that holds a node's saved file beside it, counted 2 nodes, and the
    node compared with itself."""
    node = tmp_path / "node.json"
    snap = recorded_snapshot(tmp_path, "healthy_h200x2").to_dict()
    node.write_text(json.dumps(snap))
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"nodes": [snap]}))
    for second in (node, report):
        result = runner.invoke(doctor_app(), ["doctor", "--from", str(node), "--from", str(second)])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: the snapshot of ") and result.output.count("\n") == 1
        assert f"is in {node} and again in {second}: give each node's snapshot once" in result.output
    other = dict(snap, host="another-node")
    (tmp_path / "other.json").write_text(json.dumps(other))
    two = runner.invoke(
        doctor_app(), ["doctor", "--json", "--from", str(node), "--from", str(tmp_path / "other.json")]
    )
    assert len(json.loads(two.stdout)["nodes"]) == 2, two.output


def test_save_with_from_is_refused_not_ignored(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    node.write_text(json.dumps(recorded_snapshot(tmp_path, "healthy_h200x2").to_dict()))
    saved = tmp_path / "saved.json"
    result = runner.invoke(doctor_app(), ["doctor", "--from", str(node), "--save", str(saved)])
    assert result.exit_code == 2 and "--save writes this host's snapshot" in result.output, result.output
    assert not saved.exists()


def test_save_onto_the_store_is_refused_before_probing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--save over the store a run writes (MOELAB_DB here) would replace every stored run with one JSON."""
    store = tmp_path / "moelab.duckdb"
    store.write_bytes(b"a store")
    monkeypatch.setenv("MOELAB_DB", str(store))
    result = runner.invoke(doctor_app(), ["doctor", "--load-ms", "0", "--save", str(store)])
    assert result.exit_code == 2 and "--save" in result.output and "is the database" in result.output, (
        result.output
    )
    assert store.read_bytes() == b"a store"


def test_real_doctor_on_this_machine_runs(tmp_path: Path) -> None:
    result = runner.invoke(
        doctor_app(), ["doctor", "--json", "--load-ms", "0", "--sysfs-root", str(tmp_path)]
    )
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.output)
    (node,) = report["nodes"]
    assert node["nvml_available"] or any(f["check"] == "nvml" for f in report["findings"])


def test_help_text() -> None:
    result = runner.invoke(doctor_app(), ["doctor", "--help"])
    assert result.exit_code == 0
    assert "--json" in result.output and "--from" in result.output and "--load-ms" in result.output
