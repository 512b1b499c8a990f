"""Golden tests of the exact launcher command lines (moelab.job.launchers).

Golden files live in tests/golden/launch/; the example batch scripts in containers/slurm/ are generated
from the same function and must stay in sync. After an intended change, regenerate both with

    UPDATE_GOLDEN=1 python -m pytest tests/launch/test_launch_commands.py

and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

import pytest

from moelab.core.errors import MoelabError, SpecError
from moelab.job.launchers import (
    LaunchPlan,
    NsysWrap,
    SbatchOptions,
    auto_launcher,
    command_line,
    default_master_port,
    dist_env_from_mpi,
    dist_env_from_slurm,
    expand_hostlist,
    expand_tasks_per_node,
    launch_argvs,
    mpirun_argv,
    sbatch_script,
    srun_argv,
    torchrun_local_argv,
    torchrun_multinode_argv,
)

ROOT = Path(__file__).resolve().parent.parent.parent
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "launch"
CONTAINER_SCRIPTS = ROOT / "containers" / "slurm"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"  # test-only switch, documented above

NODE_COUNTS = (1, 2, 4)


def _plan(launcher: str, nodes: int, **kw: object) -> LaunchPlan:
    base: dict[str, object] = dict(
        launcher=launcher,
        nodes=nodes,
        gpus_per_node=8,
        worker_args=("/shared/moelab/runs/r1", "hybrid-ep"),
        rdzv_endpoint="node001:29500",
        rdzv_id="r1",
        env={"NCCL_DEBUG": "WARN"},
        sbatch=SbatchOptions(partition="gpu", account="moe", time="01:00:00"),
    )
    base.update(kw)
    return LaunchPlan(**base)  # type: ignore[arg-type]


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file (UPDATE_GOLDEN=1 to accept)"


def _lines(argvs: list[list[str]]) -> str:
    return "".join(shlex.join(a) + "\n" for a in argvs)


CASES = {
    "torchrun": lambda p: _lines(launch_argvs(p)),
    "srun": lambda p: _lines([srun_argv(p)]),
    "mpirun": lambda p: _lines([mpirun_argv(p)]),
    "sbatch": lambda p: sbatch_script(p),
}


@pytest.mark.parametrize("nodes", NODE_COUNTS)
@pytest.mark.parametrize("kind", sorted(CASES))
def test_golden_command_lines(kind: str, nodes: int) -> None:
    launcher = {"torchrun": "torchrun", "srun": "slurm", "sbatch": "slurm", "mpirun": "mpirun"}[kind]
    _check_golden(f"{kind}_{nodes}node.txt", CASES[kind](_plan(launcher, nodes)))


@pytest.mark.parametrize("kind", sorted(CASES))
def test_golden_nsys_wrapped(kind: str) -> None:
    launcher = {"torchrun": "torchrun", "srun": "slurm", "sbatch": "slurm", "mpirun": "mpirun"}[kind]
    plan = _plan(launcher, 2, nsys=NsysWrap(output="/shared/moelab/runs/r1/nsys/hybrid-ep"))
    _check_golden(f"{kind}_2node_nsys.txt", CASES[kind](plan))


def test_golden_local() -> None:
    plan = _plan("local", 1, gpus_per_node=2, python="/usr/bin/python3")
    _check_golden("local_1node.txt", _lines([torchrun_local_argv(plan)]))


def test_local_refuses_more_than_one_node() -> None:
    with pytest.raises(SpecError, match="local launcher runs one node"):
        torchrun_local_argv(_plan("local", 2))


def test_torchrun_commands_are_one_per_node_and_differ_only_in_store_host() -> None:
    argvs = launch_argvs(_plan("torchrun", 4))
    assert len(argvs) == 4
    assert [a[a.index("--rdzv-conf") + 1] for a in argvs] == ["is_host=true"] + ["is_host=false"] * 3
    stripped = [[w for w in a if not w.startswith("is_host=")] for a in argvs]
    assert all(s == stripped[0] for s in stripped)
    assert "--node-rank" not in argvs[0]  # ignored by c10d: the rendezvous assigns group ranks


def test_torchrun_without_endpoint_is_an_error() -> None:
    with pytest.raises(SpecError, match="rdzv-endpoint"):
        torchrun_multinode_argv(_plan("torchrun", 2, rdzv_endpoint=None))


def test_torchrun_nsys_uses_no_python_and_rank_placeholder() -> None:
    argv = torchrun_multinode_argv(_plan("torchrun", 2, node_rank=1, nsys=NsysWrap(output="rep")))
    i = argv.index("--no-python")
    assert argv[i + 1] == "nsys"
    assert "rep_rank%q{RANK}" in argv
    assert argv[-5:] == ["python3", "-m", "moelab.measure.worker", "/shared/moelab/runs/r1", "hybrid-ep"]


def test_srun_cpu_plan_requests_no_gpus_and_passes_containers() -> None:
    plan = _plan(
        "slurm",
        2,
        device="cpu",
        env={},
        sbatch=SbatchOptions(
            container_image="nvcr.io#nvidia/pytorch:25.01-py3", container_mounts=("/a:/a", "/b:/b")
        ),
    )
    argv = srun_argv(plan)
    assert "--gpus-per-node" not in argv
    assert argv[argv.index("--container-image") + 1] == "nvcr.io#nvidia/pytorch:25.01-py3"
    assert argv[argv.index("--container-mounts") + 1] == "/a:/a,/b:/b"
    assert not any(a.startswith("--export") for a in argv)


def test_srun_refuses_comma_in_exported_value() -> None:
    with pytest.raises(SpecError, match="comma"):
        srun_argv(_plan("slurm", 1, env={"NCCL_IB_HCA": "mlx5_0,mlx5_1"}))


def test_user_input_is_never_interpreted_by_a_shell() -> None:
    evil = "/runs/$(rm -rf ~);x"
    plan = _plan("slurm", 2, worker_args=(evil, "nccl-a2a"))
    assert evil in srun_argv(plan)  # argv: passed as one word, untouched
    script = sbatch_script(plan)
    assert shlex.quote(evil) in script
    assert "$(rm" not in script.replace(shlex.quote(evil), "")


def test_bad_env_name_rejected() -> None:
    with pytest.raises(SpecError, match="invalid environment variable"):
        srun_argv(_plan("slurm", 1, env={"A B": "1"}))


def test_sbatch_script_params_expand_only_declared_names() -> None:
    plan = _plan("slurm", 1, worker_args=("${RUN_DIR}", "${HOME}"))
    script = sbatch_script(plan, script_params=("RUN_DIR",))
    assert 'RUN_DIR="${1:?usage: sbatch $0 RUN_DIR}"' in script
    assert '"${RUN_DIR}"' in script
    assert "'${HOME}'" in script  # not declared: literal
    mounts = sbatch_script(
        _plan("slurm", 1, sbatch=SbatchOptions(container_mounts=('${RUN_DIR}:/r"`x',))),
        script_params=("RUN_DIR",),
    )
    assert '"${RUN_DIR}:/r\\"\\`x"' in mounts


def test_command_line_quotes_env_and_words() -> None:
    assert command_line(["echo", "a b"], {"X": "1 2"}) == "X='1 2' echo 'a b'"


def test_auto_launcher() -> None:
    assert auto_launcher({"SLURM_JOB_ID": "42"}) == "slurm"
    assert auto_launcher({"SLURM_JOB_ID": ""}) == "local"
    assert auto_launcher({}) == "local"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[1-2],b5,c[09-11]", ["a1", "a2", "b5", "c09", "c10", "c11"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("gpu[8-10]-ib", ["gpu8-ib", "gpu9-ib", "gpu10-ib"]),
        ("x[007]", ["x007"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["node[01-03", "node01]", "n[a-b]", "n[3-1]", ""])
def test_expand_hostlist_rejects(bad: str) -> None:
    with pytest.raises(MoelabError):
        expand_hostlist(bad)


def test_expand_tasks_per_node() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    with pytest.raises(MoelabError):
        expand_tasks_per_node("2(x)")


SLURM_TASK = {
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "3",
    "SLURM_PROCID": "9",
    "SLURM_NTASKS": "16",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-09]",
    "SLURM_STEP_NODELIST": "gpu[08-09]",
    "SLURM_TASKS_PER_NODE": "8(x2)",
}


def test_dist_env_from_slurm() -> None:
    env = dist_env_from_slurm(SLURM_TASK)
    assert env == {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "gpu08",  # the step's first host, not the job's
        "MASTER_PORT": str(default_master_port(1234, 3)),
    }
    assert 20000 <= int(env["MASTER_PORT"]) < 30000


def test_dist_env_from_slurm_keeps_exported_port_and_uneven_nodes() -> None:
    task = {**SLURM_TASK, "MASTER_PORT": "29555", "SLURM_TASKS_PER_NODE": "3,1", "SLURM_NTASKS": "4"}
    task.update(SLURM_PROCID="3", SLURM_LOCALID="0", SLURM_NODEID="1")
    del task["SLURM_STEP_NODELIST"]
    env = dist_env_from_slurm(task)
    assert (env["LOCAL_WORLD_SIZE"], env["MASTER_PORT"], env["MASTER_ADDR"]) == ("1", "29555", "gpu07")


def test_dist_env_from_slurm_missing_and_inconsistent() -> None:
    with pytest.raises(MoelabError, match="SLURM_PROCID"):
        dist_env_from_slurm({k: v for k, v in SLURM_TASK.items() if k != "SLURM_PROCID"})
    with pytest.raises(MoelabError, match="inconsistent"):
        dist_env_from_slurm({**SLURM_TASK, "SLURM_PROCID": "16"})


def test_dist_env_from_openmpi_and_mpich() -> None:
    ompi = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
    }
    assert dist_env_from_mpi(ompi) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
    }
    mpich = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert dist_env_from_mpi({**mpich, "MASTER_ADDR": "h", "MASTER_PORT": "1"})["GROUP_RANK"] == "1"


def test_dist_env_from_bare_pmix_needs_sizes() -> None:
    env = {"PMIX_RANK": "6", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(MoelabError, match="run spec"):
        dist_env_from_mpi(env)
    out = dist_env_from_mpi(env, world_size=8, local_world_size=4)
    assert (out["LOCAL_RANK"], out["GROUP_RANK"]) == ("2", "1")


def test_dist_env_from_mpi_needs_master_and_a_rank() -> None:
    with pytest.raises(MoelabError, match="MASTER_ADDR"):
        dist_env_from_mpi({"PMIX_RANK": "0"}, world_size=1, local_world_size=1)
    with pytest.raises(MoelabError, match="not started by mpirun"):
        dist_env_from_mpi({})


def test_mpirun_exports_master_and_packs_by_node() -> None:
    argv = mpirun_argv(_plan("mpirun", 2, hosts=("n1", "n2"), env={}))
    assert argv[:8] == ["mpirun", "-np", "16", "--map-by", "ppr:8:node", "--bind-to", "none", "-H"]
    assert argv[8] == "n1:8,n2:8"
    assert argv[9:13] == ["-x", "MASTER_ADDR=node001", "-x", "MASTER_PORT=29500"]


def container_example_plan(nodes: int) -> LaunchPlan:
    """The plan behind containers/slurm/moelab-<N>node.sbatch."""
    return LaunchPlan(
        launcher="slurm",
        nodes=nodes,
        gpus_per_node=8,
        worker_args=("${RUN_DIR}", "${BACKEND}"),
        env={"PYTHONFAULTHANDLER": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"},
        sbatch=SbatchOptions(
            job_name=f"moelab-{nodes}node",
            time="00:30:00",
            container_image="${IMAGE}",
            container_mounts=("${RUN_DIR}:${RUN_DIR}",),
        ),
    )


@pytest.mark.parametrize("nodes", NODE_COUNTS)
def test_container_batch_scripts_in_sync(nodes: int) -> None:
    plan = container_example_plan(nodes)
    text = sbatch_script(plan, script_params=("RUN_DIR", "BACKEND", "IMAGE"))
    path = CONTAINER_SCRIPTS / f"moelab-{nodes}node.sbatch"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} is out of sync with sbatch_script (UPDATE_GOLDEN=1 regenerates)"


def test_plan_is_frozen() -> None:
    plan = _plan("slurm", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.nodes = 2  # type: ignore[misc]
