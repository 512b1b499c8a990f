"""`moelab model` through the command a user types: the bound of a topology and workload, link figures
from the table, from flags or from a stored run's measured peaks, and `--check-published`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from moelab.cli.main import app
from moelab.core.peaks import MeasuredPeak, write_peaks
from moelab.model import published
from moelab.store.db import connect
from moelab.store.ingest import ingest
from tests.synthetic_runs import RunModel, write_run


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(app, ["model", *args])


def _json(args: list[str]) -> dict[str, Any]:
    res = _invoke([*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_check_published_json_passes_with_every_row_under_its_bound() -> None:
    res = _invoke(["--check-published", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (
        doc["ok"] is True
        and doc["summary"]["rows_held"] >= 150
        and doc["summary"]["tables_with_held_rows"] >= 6
    )
    assert doc["summary"]["rows_above_bound"] == 0 and len(doc["rows"]) >= 150
    assert all(t["problems"] == [] for t in doc["tables"])
    assert any(u["reason"] for t in doc["tables"] for u in t["unexpressed"])
    for row in doc["rows"]:
        assert 0 < row["ratio"] <= 1.0, row["id"]
        assert row["ratio"] >= published.LOW_RATIO or row["reason"], row["id"]
        assert row["source"]["commit"] and row["source"]["repository"] and row["version"]
        assert row["bound_time_us"] > row["bound"]["latency_us"] > 0


def test_check_published_table_names_rows_and_sources() -> None:
    res = _invoke(["--check-published"])
    assert res.exit_code == 0, res.output
    assert "deepep-v1/normal/ep64/combine" in res.stdout and "published / bound" in res.stdout
    assert "source of deepep-v1/low_latency: DeepEP README.md" in res.stdout and "de8cfca" in res.stdout
    assert "rows that hold" in res.stdout and "cannot express" in res.stdout


def test_check_published_fails_on_a_row_above_its_bound(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = published.dataset_paths()["deepep-v1"].read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(real.replace("gbps = 153\n", "gbps = 400\n"))
    monkeypatch.setattr(published, "dataset_paths", lambda: {"bad": bad})
    res = _invoke(["--check-published", "--json"])
    assert res.exit_code == 1
    assert json.loads(res.stdout)["ok"] is False
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(
        "error: 1 published row(s) fail the model: bad/normal/ep8/dispatch"
    )


def test_default_is_every_family_on_one_h100_node() -> None:
    doc = _json([])
    topo = doc["topology"]
    assert (topo["nodes"], topo["gpus_per_node"], topo["gpu"]) == (1, 8, "H100")
    (nvlink,) = topo["links"]  # one node: only the intra-node link carries bytes
    assert nvlink["name"] == "nvlink" and "table H100" in nvlink["source"]
    assert [(b["family"], b["op"]) for b in doc["bounds"]] == [
        (f, op) for f in ("flat", "hierarchical", "low_latency") for op in ("dispatch", "combine")
    ]
    assert doc["traffic"]["method"].startswith("closed form")
    flat = doc["bounds"][0]
    assert flat["bottleneck"].startswith("nvlink") and flat["time_us"] == pytest.approx(
        flat["transfer_us"] + 3.0
    )


def test_several_nodes_with_a_named_nic_and_published_shape() -> None:
    doc = _json(
        [
            "--nodes",
            "4",
            "--gpu",
            "H800",
            "--nic",
            "ConnectX-7",
            "--hidden",
            "7168",
            "--experts",
            "256",
            "--dtype",
            "fp8",
            "--routing",
            "grouped",
            "--topk-groups",
            "4",
        ]
    )
    assert doc["topology"]["world"] == 32 and doc["workload"]["experts_per_rank"] == 8
    nic = {
        b["family"]: max(x["bytes"] for x in b["links"] if x["link"] == "nic")
        for b in doc["bounds"]
        if b["op"] == "dispatch"
    }
    assert nic["hierarchical"] < nic["flat"] < nic["low_latency"]
    hier = next(b for b in doc["bounds"] if b["family"] == "hierarchical" and b["op"] == "dispatch")
    assert hier["definitions"]["rdma_pairs"]["bound_gbps"] == pytest.approx(
        65.9, rel=0.01
    )  # the EP32 row's bound


def test_flags_replace_table_figures_and_pcie_only() -> None:
    doc = _json(["--nvlink-gbps", "100", "--family", "flat", "--latency-us", "0"])
    assert doc["topology"]["links"][0] == {"name": "nvlink", "gbps": 100.0, "source": "flag --nvlink-gbps"}
    assert all(b["latency_us"] == 0 for b in doc["bounds"]) and {b["family"] for b in doc["bounds"]} == {
        "flat"
    }
    pcie = _json(["--pcie-only", "--gpus-per-node", "4", "--nodes", "2", "--family", "low-latency"])
    assert pcie["topology"]["pcie_only"] and [k["name"] for k in pcie["topology"]["links"]] == ["pcie", "nic"]


def test_skewed_routing_is_counted_with_the_generator() -> None:
    doc = _json(["--routing", "zipf", "--gpus-per-node", "4", "--tokens-per-rank", "256"])
    assert doc["traffic"]["method"].startswith("counted over every rank's routing (4 ranks, zipf1.2 seed 0)")
    assert _json(["--count", "--gpus-per-node", "2", "--experts-per-rank", "4", "--tokens-per-rank", "64"])[
        "traffic"
    ]["method"].startswith("counted")


def test_from_run_takes_topology_gpu_and_measured_peaks(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", RunModel(run_id="r-peaks", gpu_name="NVIDIA H200", world=2))
    write_peaks(
        run_dir / "peaks.json",
        [MeasuredPeak(name="peer_copy_shift1", gbps=501.5, bytes=1 << 28, definition="peer copy")],
    )
    db = tmp_path / "m.duckdb"
    con = connect(db)
    ingest(con, run_dir)
    con.close()
    doc = _json(["--from-run", "r-peaks", "--db", str(db), "--experts-per-rank", "8"])
    topo = doc["topology"]
    assert (topo["world"], topo["gpus_per_node"], topo["gpu"]) == (2, 2, "NVIDIA H200")
    link = topo["links"][0]
    assert (link["name"], link["gbps"]) == ("nvlink", 501.5)
    assert link["source"].startswith(
        "measured link capacity of run r-peaks, above the table's 478 GB/s (table H200"
    )
    res = _invoke(["--from-run", "r-missing", "--db", str(db)])
    assert res.exit_code == 2 and res.stderr.startswith(
        "error: no such run: 'r-missing' is neither a label nor a run id"
    )


def test_nic_rails_nic_and_pcie_figures_and_a_peaks_file(tmp_path: Path) -> None:
    doc = _json(["--nodes", "2", "--nics-per-node", "4", "--nic-gbps", "40", "--pcie-gbps", "30"])
    links = {k["name"]: k for k in doc["topology"]["links"]}
    assert links["nic"]["gbps"] == 40 * 4 / 8 and "4 NIC(s) per 8 GPUs" in links["nic"]["source"]
    assert links["pcie"] == {"name": "pcie", "gbps": 30.0, "source": "flag --pcie-gbps"}
    peaks = tmp_path / "peaks.toml"
    peaks.write_text('[gpu."Z9000"]\nlink = "NVLink9"\ngbps = 1000.0\n')
    custom = _json(["--peaks", str(peaks), "--gpu", "Z9000"])
    nvlink = custom["topology"]["links"][0]
    assert nvlink["gbps"] == 1000.0 and "peaks.toml" in nvlink["source"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--family", "ring"], "--family takes all or any of flat, hierarchical, low-latency"),
        (["--experts", "255"], "--experts 255 does not divide over 8 ranks"),
        (["--experts", "256", "--experts-per-rank", "2"], "not both"),
        (["--gpu", "Z9000"], "no link figures for GPU 'Z9000'"),
        (["--nodes", "2", "--nic", "Myrinet"], "no link figure for NIC 'Myrinet'"),
        (["--combine-dtype", "fp16"], "unknown --combine-dtype 'fp16'"),
        (
            ["--routing", "grouped", "--group-ranks", "3"],
            "grouped routing: 8 ranks are not groups of group_ranks 3",
        ),
        (["--from-run", "nope", "--db", "/nonexistent/x.duckdb"], "no database at"),
        (["--latency-us", "-1"], "--latency-us must be between 0 and 1,000,000 µs, got -1"),
        # absurd magnitudes: a 295-digit bound in seconds, or a bound of zero
        (["--nvlink-gbps", "1e-300"], "--nvlink-gbps must be between 0.001 and 1,000,000 GB/s"),
        (["--pcie-only", "--pcie-gbps", "1e300"], "--pcie-gbps must be between 0.001 and 1,000,000 GB/s"),
        (["--nodes", "2", "--nic-gbps", "0"], "--nic-gbps must be a positive finite number"),
        (["--latency-us", "1e300"], "--latency-us must be between 0 and 1,000,000 µs, got 1e+300"),
        # a flag the model would not read
        (["--zipf-s", "2"], "--zipf-s shapes zipf routing; this model's routing is uniform"),
        (["--routing", "zipf", "--hot-share", "0.3"], "--hot-share shapes hot routing"),
        (["--routing", "hot", "--group-ranks", "4"], "--group-ranks shapes grouped routing"),
        (["--routing", "zipf", "--count"], "zipf routing is always counted"),
        (["--seed", "3"], "--seed: uniform routing is modelled by its closed form"),
        (["--check-published", "--nodes", "4"], "--nodes would be ignored"),
        (
            ["--check-published", "--family", "flat", "--hidden", "4096"],
            "--hidden, --family would be ignored",
        ),
        (["--check-published", "--count"], "--count would be ignored"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], needle: str) -> None:
    res = _invoke(args)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and needle in res.stderr


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        # a key the table does not read was ignored, and the bound used the built-in figure instead
        *(
            (
                f'gbps = 400\nintra = "pcie"\n{key} = 10',
                f"[gpu.'H100']: unknown key(s) {key} (known: gbps, host_gbps, intra, link)",
            )
            for key in ("host_gpbs", "pcie_gbps")
        ),
        # a rate past any link's made every bound a 295-digit number of seconds, or zero
        ("gbps = 1e-300", "gbps must be between 0.001 and 1,000,000 GB/s per direction"),
        ("gbps = 400\nhost_gbps = 1e9", "host_gbps must be between 0.001 and 1,000,000 GB/s per direction"),
    ],
)
def test_a_bad_peaks_entry_is_refused(tmp_path: Path, body: str, needle: str) -> None:
    peaks = tmp_path / "peaks.toml"
    peaks.write_text(f'[gpu."H100"]\n{body}\n')
    res = _invoke(["--peaks", str(peaks)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert needle in res.stderr


def test_run_dry_run_prints_each_planned_cases_bound_after_the_commands(tmp_path: Path) -> None:
    args = [
        "run",
        "--cpu",
        "--dry-run",
        "--run-id",
        "X",
        "--launcher",
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "-b",
        "deepep,nccl-a2a",
        "--suite",
        "deepep-v1-normal",
        "--out",
        str(tmp_path),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    head, sep, table = res.stdout.partition(
        "lower bound per planned case (moelab model): 2 node(s) x 8 ranks, H100"
    )
    assert sep, res.stdout
    # the plan as before: the note, then one srun line per backend, nothing else
    lines = head.splitlines()
    assert lines[0] == "no GPU in use: running 16 CPU ranks on gloo"
    assert len(lines) == 3 and all(
        x.startswith("srun --nodes 2 --ntasks-per-node 8 --ntasks 16 ") for x in lines[1:]
    )
    assert lines[1].endswith(" deepep") and lines[2].endswith(" nccl-a2a")
    deepep = next(x for x in table.splitlines() if "│ deepep " in x)
    assert "hierarchical" in deepep and "dispatch 43 GB/s rdma_pairs (DeepEP 3b1045d)" in deepep
    flat = next(x for x in table.splitlines() if "│ nccl-a2a " in x)
    assert "flat" in flat and "ms" in flat  # across two nodes a flat all-to-all of 60 MB per rank takes ms


def test_from_run_models_the_runs_own_workload_on_a_stored_2_rank_cpu_run(tmp_path: Path) -> None:
    """Issue 34, fix 4: a 2-rank run with 2 experts per rank and top-2 (4 experts in all) was refused
    (`topk 8 > total experts 4`): --from-run took the run's topology but the default workload. The README's
    `moelab model --from-run nightly --json`, on a real `moelab run --cpu` (gloo) stored with that label."""
    db = tmp_path / "m.duckdb"
    ran = CliRunner().invoke(
        app,
        ["run", "--cpu", "--backend", "nccl-a2a", "--hidden", "128", "--tokens-per-rank", "16", "--topk", "2",
         "--experts-per-rank", "2", "--iters", "2", "--warmup", "0", "--sms", "default", "--no-health",
         "--label", "nightly", "--out", str(tmp_path / "runs"), "--run-id", "r-cpu", "--db", str(db)],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    doc = _json(["--from-run", "nightly", "--db", str(db)])
    assert (doc["topology"]["world"], doc["topology"]["gpus_per_node"]) == (2, 2)
    wl = doc["workload"]
    assert (wl["hidden"], wl["tokens_per_rank"], wl["topk"], wl["experts_per_rank"], wl["dtype"]) == (
        128, 16, 2, 2, "bf16",
    )  # fmt: skip
    assert wl["routing"]["kind"] == "uniform" and doc["bounds"]
    # a flag given wins over the run's value; the rest stays the run's
    wl = _json(["--from-run", "nightly", "--db", str(db), "--tokens-per-rank", "64"])["workload"]
    assert (wl["hidden"], wl["tokens_per_rank"], wl["topk"]) == (128, 64, 2)
    # what the run cannot hold is still one error line
    res = _invoke(["--from-run", "nightly", "--db", str(db), "--topk", "8"])
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and errors[0].startswith("error: topk 8 > total experts 4")


def test_from_run_takes_a_stored_skewed_routing_with_its_parameters(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", RunModel(run_id="r-sweep", world=2, tokens=(256, 512), topk=4))
    db = tmp_path / "m.duckdb"
    con = connect(db)
    ingest(con, run_dir)
    con.close()
    res = _invoke(["--from-run", "r-sweep", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "run r-sweep has 2 workloads: modelled its first, h1024-t256-k4-e8-" in " ".join(
        res.stderr.split()
    )
