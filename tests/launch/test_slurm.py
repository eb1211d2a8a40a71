"""The Slurm contract (train/launch/slurm.py): host lists expanded as ``scontrol show hostnames`` does, a job step
read into a Topology, explicit variables winning over Slurm's, and the plan of a 2-node step.

The environments are what Slurm 22.05 (Debian 12's slurm-wlm) set in `srun --nodes=2 --ntasks-per-node=1` tasks and
in a batch script, recorded on a two-slurmd test cluster (tests/e2e/slurm_cluster.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fakes import h100s, install, uuid_of
from tests.launch.common import STOP, plan_ok, run_plan, torchrun_flags
from train.common.errors import ConfigError
from train.launch import slurm
from train.launch import topology as cluster
from train.launch.slurm import HostlistError, expand_hostlist

# ---- host lists ----------------------------------------------------------------------------------------------------

EXPANSIONS = {
    "node[01-04,07]": ["node01", "node02", "node03", "node04", "node07"],
    "a,b[1-2]": ["a", "b1", "b2"],
    "rack[1-2]-node[01-02]": ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
    "n[1-2][3-4]": ["n13", "n14", "n23", "n24"],
    "n[1-2]-ib[1-2],x": ["n1-ib1", "n1-ib2", "n2-ib1", "n2-ib2", "x"],
    "node[8-10]": ["node8", "node9", "node10"],
    "node[008-010]": ["node008", "node009", "node010"],
    "n[099-101]": ["n099", "n100", "n101"],
    "n[1-010]": [f"n{i}" for i in range(1, 11)],  # the lower bound's width: unpadded
    "n[01-3]": ["n01", "n02", "n03"],
    "node[0001-0002]": ["node0001", "node0002"],
    "n[0-0]": ["n0"],
    "n[001]": ["n001"],
    "[1-2]": ["1", "2"],
    "gpu-a100-01": ["gpu-a100-01"],
    "a,,b": ["a", "b"],
    " n1 , n2 ": ["n1", "n2"],
    "a b\tc": ["a", "b", "c"],
    "n[1,1],n1": ["n1", "n1", "n1"],  # duplicates are kept
    "mlmnode[1-2]": ["mlmnode1", "mlmnode2"],
}

INVALID = {
    "n[9-11]x": "text after the last",
    "a[1-2]b,c": "text after the last",
    "n[3-1]": "runs backwards",
    "n[a-b]": "'a-b' is not a number",
    "n[]": "'' is not a number",
    "n[1,,2]": "'' is not a number",
    "n[-1]": "'-1' is not a number",
    "n[1-2-3]": "'1-2-3' is not a number",
    "n[1-3]-[a]": "'a' is not a number",
    "n[１-２]": "is not a number",  # full-width digits are not Slurm's
    "": "no host",
    " , ": "no host",
}

# Malformed where scontrol guesses (a stray ']' becomes part of a name, an unclosed '[' is closed for you, C's
# strtoul takes "+1" for 1): a host name has no brackets and Slurm writes no signs, so these are errors here.
REJECTED_WHERE_SCONTROL_GUESSES = {
    "n[+1]": "'\\+1' is not a number",
    "n1-2]": "a ']' without its '\\['",
    "n[1-2": "a '\\[' without its '\\]'",
    "n[[1-2]]": "a '\\[' inside brackets",
}


@pytest.mark.parametrize(("text", "hosts"), EXPANSIONS.items())
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(("text", "message"), {**INVALID, **REJECTED_WHERE_SCONTROL_GUESSES}.items())
def test_expand_hostlist_rejects(text, message):
    with pytest.raises(HostlistError, match=message):
        expand_hostlist(text)


def test_expand_hostlist_refuses_a_runaway_range():
    assert len(expand_hostlist("n[1-65536]")) == 65536
    for text in ("n[0-999999999]", "n[1-65536],x", "a[1-300]b[1-300]", "n[1-40000,1-40000]"):
        with pytest.raises(HostlistError, match="more than 65536 hosts"):
            expand_hostlist(text)


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """``scontrol show hostnames`` where Slurm's client is installed (bash .ci/system-deps.sh); it needs a
    slurm.conf to start, not a controller."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (bash .ci/system-deps.sh installs slurm-client)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\n")

    def show_hostnames(text: str) -> list[str] | None:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", text],
            env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if not done.stdout.strip() and done.stderr.strip():
            return None  # scontrol says "Invalid hostlist" (on stderr, exit status 0)
        return done.stdout.split()

    return show_hostnames


@pytest.mark.parametrize("text", [t for t in [*EXPANSIONS, *INVALID, "n[1-65536]"] if t.strip(" ,")])
def test_expand_hostlist_agrees_with_scontrol(scontrol, text):
    expected = scontrol(text)
    if expected is None:
        with pytest.raises(HostlistError):
            expand_hostlist(text)
    else:
        assert expand_hostlist(text) == expected


# ---- a job step ----------------------------------------------------------------------------------------------------

JOB_ID = "4242"
PORT = 61000 + 4242 % 4536


def step(node_id: int = 0, **extra: str) -> dict[str, str]:
    """What `srun --nodes=2 --ntasks-per-node=1` sets in its task on node ``node_id`` (Slurm 22.05)."""
    env = {
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOBID": JOB_ID,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_NODEID": str(node_id),
        "SLURM_PROCID": str(node_id),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7",
        "SLURM_TOPOLOGY_ADDR": f"gpu0{7 + node_id}",
    }
    env.update(extra)
    return env


def test_a_two_node_step_is_a_static_rendezvous_at_its_first_host():
    node0 = cluster.topology_from_env(step(0))
    assert (node0.nnodes, node0.node_rank, node0.mode) == ("2", 0, "static")
    assert (node0.master_addr, node0.master_port, node0.rdzv_id) == ("gpu07", PORT, JOB_ID)
    assert node0.sources == {
        "nnodes": "SLURM_STEP_NUM_NODES",
        "node_rank": "SLURM_NODEID",
        "master_addr": "SLURM_STEP_NODELIST",
        "master_port": "SLURM_JOB_ID",
        "rdzv_id": "SLURM_JOB_ID",
    }
    assert node0.hosts_rendezvous and node0.address_to_wait_for is None
    node1 = cluster.topology_from_env(step(1))
    assert (node1.node_rank, node1.master_addr, node1.master_port) == (1, "gpu07", PORT)
    assert node1.address_to_wait_for == ("gpu07", "SLURM_STEP_NODELIST")


def test_the_port_follows_the_job_id_like_enroots_pytorch_hook():
    ports = {job: cluster.topology_from_env(step(0, SLURM_JOB_ID=str(job))).master_port for job in (0, 1, 4535, 4536)}
    assert ports == {0: 61000, 1: 61001, 4535: 65535, 4536: 61000}


def test_older_slurm_without_step_variables_uses_the_generic_ones():
    env = step(1)
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS"):
        del env[name]
    topology = cluster.topology_from_env(env)
    assert (topology.nnodes, topology.node_rank, topology.master_addr) == ("2", 1, "gpu07")
    assert topology.sources["nnodes"] == "SLURM_NNODES" and topology.sources["master_addr"] == "SLURM_JOB_NODELIST"


def test_a_step_on_part_of_the_job_counts_the_steps_nodes():
    # srun --nodes=1 -w gpu08 inside the 2-node job: SLURM_JOB_* still name both nodes (recorded on Slurm 22.05).
    env = step(0, SLURM_NNODES="1", SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="gpu08", SLURM_STEP_NUM_TASKS="1")
    env["SLURM_NTASKS"] = "1"
    topology = cluster.topology_from_env(env)
    assert (topology.mode, topology.nnodes, topology.node_rank) == ("standalone", "1", 0)
    assert "master_port" not in topology.sources and topology.rdzv_id is None
    two_of_four = step(1, SLURM_JOB_NUM_NODES="4", SLURM_JOB_NODELIST="gpu[05-08]", SLURM_NODELIST="gpu[05-08]")
    assert cluster.topology_from_env(two_of_four).master_addr == "gpu07"  # the step's node 0, not the job's


def test_a_one_node_job_is_standalone_in_a_step_or_in_the_batch_script():
    one = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"}
    assert cluster.topology_from_env(one).mode == "standalone"  # the batch script: no SLURM_STEP_ID
    one_step = {**one, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "gpu01"}
    topology = cluster.topology_from_env(one_step)
    assert topology.mode == "standalone"
    assert topology.sources == {"nnodes": "SLURM_STEP_NUM_NODES", "node_rank": "SLURM_NODEID"}


def test_explicit_variables_win_over_slurms():
    explicit = {
        "NNODES": "3",
        "NODE_RANK": "2",
        "MASTER_ADDR": "10.1.0.7",
        "MASTER_PORT": "29400",
        "PET_RDZV_ID": "mine",
    }
    topology = cluster.topology_from_env(step(1, **explicit))
    assert (topology.nnodes, topology.node_rank) == ("3", 2)
    assert (topology.master_addr, topology.master_port, topology.rdzv_id) == ("10.1.0.7", 29400, "mine")
    assert topology.sources == {
        "nnodes": "NNODES",
        "node_rank": "NODE_RANK",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT",
        "rdzv_id": "PET_RDZV_ID",
    }
    pet_env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"}
    pet = cluster.topology_from_env(step(0, **pet_env))
    assert (pet.node_rank, pet.master_addr, pet.master_port) == (1, "m", 1)


def test_each_variable_wins_on_its_own():
    # enroot's PyTorch hook (pyxis with a PyTorch image) sets MASTER_ADDR and MASTER_PORT from the same Slurm facts;
    # an InfiniBand address for node 0 is the other common reason to set only MASTER_ADDR.
    topology = cluster.topology_from_env(step(1, MASTER_ADDR="gpu07-ib"))
    assert (topology.nnodes, topology.node_rank) == ("2", 1)
    assert (topology.master_addr, topology.master_port) == ("gpu07-ib", PORT)
    assert topology.address_to_wait_for == ("gpu07-ib", "MASTER_ADDR")


def test_an_elastic_range_set_by_hand_meets_at_slurms_first_host():
    topology = cluster.topology_from_env(step(1, PET_NNODES="1:2"))
    assert (topology.mode, topology.rdzv_backend, topology.rdzv_endpoint) == ("dynamic", "c10d", f"gpu07:{PORT}")
    assert topology.rdzv_id == JOB_ID and topology.sources["rdzv_endpoint"] == "SLURM_STEP_NODELIST"


def test_a_bad_host_list_matters_only_when_it_names_the_master():
    env = step(1, SLURM_STEP_NODELIST="gpu[08-07]")
    with pytest.raises(ConfigError, match=r"SLURM_STEP_NODELIST='gpu\[08-07\]': not a Slurm host list \(the range"):
        cluster.topology_from_env(env)
    assert cluster.topology_from_env({**env, "MASTER_ADDR": "gpu07"}).master_addr == "gpu07"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            step(0, SLURM_STEP_NODELIST="gpu[07-09]"),
            r"SLURM_STEP_NODELIST='gpu\[07-09\]' names 3 host\(s\) but SLURM_STEP_NUM_NODES=2: the Slurm variables disagree",
        ),
        (
            step(0, SLURM_STEP_NUM_TASKS="16", SLURM_NTASKS="16"),
            r"SLURM_STEP_NUM_TASKS=16 tasks on SLURM_STEP_NUM_NODES=2 node\(s\): start one launcher per node "
            r"\(srun --ntasks-per-node=1 entrypoint.sh \(see slurm/\)\)",
        ),
        (
            {**step(0, SLURM_STEP_NUM_TASKS="8", SLURM_NTASKS="8"), "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1"},
            r"SLURM_STEP_NUM_TASKS=8 tasks on SLURM_STEP_NUM_NODES=1 node",
        ),
        (step(2), r"SLURM_NODEID=2: expected 0\.\.1 for SLURM_STEP_NUM_NODES=2"),
        (step(0, SLURM_JOB_ID="12_3"), r"SLURM_JOB_ID='12_3': expected a Slurm job id"),
        (step(0, SLURM_STEP_NUM_NODES="two"), r"SLURM_STEP_NUM_NODES='two': expected an integer >= 1"),
        (
            {k: v for k, v in step(0).items() if k not in ("SLURM_NNODES", "SLURM_STEP_NUM_NODES")},
            "SLURM_STEP_ID=0 but neither SLURM_STEP_NUM_NODES nor SLURM_NNODES is set",
        ),
    ],
)
def test_slurm_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        cluster.topology_from_env(env)


def test_one_task_per_gpu_is_allowed_when_the_node_variables_are_explicit():
    # srun --ntasks-per-node=8 --gpus-per-task=1 with NNODES=$SLURM_NTASKS NODE_RANK=$SLURM_PROCID: each task is a
    # "node" of one GPU, by the user's choice.
    env = step(0, SLURM_STEP_NUM_TASKS="16", SLURM_NTASKS="16", NNODES="16", NODE_RANK="9")
    topology = cluster.topology_from_env(env)
    assert (topology.nnodes, topology.node_rank, topology.master_addr) == ("16", 9, "gpu07")


def test_a_multi_node_jobs_batch_script_is_refused():
    batch = {k: v for k, v in step(0).items() if not k.startswith(("SLURM_STEP", "SLURM_STEPID"))}
    with pytest.raises(ConfigError, match=r"SLURM_JOB_NUM_NODES=2 but this is the job's batch script, not a job step"):
        cluster.topology_from_env(batch)
    assert cluster.topology_from_env({**batch, "NNODES": "1"}).mode == "standalone"  # the way out the error names


# ---- the plan ------------------------------------------------------------------------------------------------------


def test_plan_of_a_two_node_step(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(8))
    # Slurm names the step's GPUs in CUDA_VISIBLE_DEVICES (0-based with ConstrainDevices, the node's /dev/nvidiaN
    # numbers without): the launcher uses those two, one rank each.
    document = plan_ok(monkeypatch, capsys, {**base_env, **step(1), "CUDA_VISIBLE_DEVICES": "2,3"})
    assert torchrun_flags(document) == [
        "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "1", "--master-addr", "gpu07", "--master-port",
        str(PORT), "--rdzv-id", JOB_ID, "--rdzv-conf", "timeout=900", "--max-restarts", "0", *STOP,
        "--local-ranks-filter", "0",
    ]  # fmt: skip
    assert (document["nnodes"], document["node_rank"], document["world_size"]) == (2, 1, 4)
    assert document["rendezvous"] == {
        "mode": "static",
        "master_addr": "gpu07",
        "master_port": PORT,
        "backend": None,
        "endpoint": None,
        "id": JOB_ID,
    }
    assert document["topology_sources"]["master_addr"] == "SLURM_STEP_NODELIST"
    assert document["env"]["CUDA_VISIBLE_DEVICES"] == f"{uuid_of(2)},{uuid_of(3)}"
    assert document["batch"] == "batch: 32 per device x 2 GPUs x 2 nodes x 1 accumulation = 128 global"


def test_plan_in_a_multi_node_batch_script_says_how_to_launch(monkeypatch, capsys, base_env, no_nvml):
    batch = {k: v for k, v in step(0).items() if not k.startswith("SLURM_STEP")}
    code, document, err = run_plan(monkeypatch, capsys, {**base_env, **batch})
    assert (code, document) == (2, None)
    assert "srun --ntasks-per-node=1 entrypoint.sh" in err


def test_the_slurm_scripts_pass_shellcheck():
    shellcheck = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck is not in .venv (make venv)")
    scripts = sorted((Path(__file__).resolve().parents[2] / "slurm").glob("*.sbatch"))
    assert scripts, "slurm/*.sbatch"
    done = subprocess.run([str(shellcheck), *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- the step on its own -------------------------------------------------------------------------------------------


def test_outside_a_step_there_is_no_step():
    assert slurm.slurm_step({}) is None
    assert slurm.slurm_step({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2"}) is None  # the batch script
    assert slurm.slurm_step({"SLURM_STEP_ID": "0"}) is None  # no job: set by hand, not Slurm's


def test_a_step_reads_the_steps_own_variables_first():
    found = slurm.slurm_step(step(1))
    assert found == slurm.SlurmStep(
        JOB_ID, 2, "SLURM_STEP_NUM_NODES", 1, "gpu[07-08]", "SLURM_STEP_NODELIST", 2, "SLURM_STEP_NUM_TASKS"
    )
    assert (found.master_port, found.first_host()) == (PORT, "gpu07")


def test_refuse_batch_script_only_for_a_multi_node_job_outside_a_step():
    batch = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}
    with pytest.raises(ConfigError, match=r"SLURM_JOB_NUM_NODES=2 but this is the job's batch script"):
        slurm.refuse_batch_script(batch)
    slurm.refuse_batch_script({**batch, "SLURM_STEP_ID": "0"})  # a step: fine
    slurm.refuse_batch_script({**batch, "SLURM_JOB_NUM_NODES": "1"})  # one node: fine
    slurm.refuse_batch_script({"SLURM_JOB_NUM_NODES": "2"})  # no job: fine


def test_the_finetune_script_scores_the_runs_checkpoints_on_one_node(tmp_path):
    """slurm/finetune.sbatch as sbatch runs it, with srun standing in (it records its arguments): one task running
    ``entrypoint.sh finetune`` over every checkpoint of MLM_OUTPUT_DIR, the user's flags after; exit 2 without it."""
    script = Path(__file__).resolve().parents[2] / "slurm" / "finetune.sbatch"
    (tmp_path / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (tmp_path / "srun").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu01",
           "SLURM_SUBMIT_DIR": "/home/me/mlm-trainer", "SRUN_ARGS": str(tmp_path / "args")}  # fmt: skip
    done = subprocess.run(["bash", str(script), "--task", "/data/task"], env={**env, "MLM_OUTPUT_DIR": "/runs/1"},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "args").read_text().split() == [
        "--ntasks-per-node=1", "/home/me/mlm-trainer/entrypoint.sh", "finetune", "--task_all_checkpoints", "true",
        "--model_name_or_path", "/runs/1", "--task", "/data/task",
    ]  # fmt: skip
    refused = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 2 and "MLM_OUTPUT_DIR: unset" in refused.stderr


def test_the_branches_script_runs_one_branch_per_array_task(tmp_path):
    """slurm/branches.sbatch as sbatch runs array task 1, with srun standing in: ``entrypoint.sh branch`` from
    BRANCH_FROM with branch-1.yaml into BRANCH_OUTPUT/1, the user's flags after; exit 2 naming what is missing."""
    script = Path(__file__).resolve().parents[2] / "slurm" / "branches.sbatch"
    (tmp_path / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (tmp_path / "srun").chmod(0o755)
    configs = tmp_path / "branches"
    configs.mkdir()
    (configs / "branch-1.yaml").write_text("max_steps: 1000\n")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu01",
           "SLURM_SUBMIT_DIR": "/home/me/mlm-trainer", "SRUN_ARGS": str(tmp_path / "args"),
           "BRANCH_FROM": "/runs/1/checkpoint-800", "BRANCH_CONFIGS": str(configs), "BRANCH_OUTPUT": "/runs/b"}  # fmt: skip
    done = subprocess.run(["bash", str(script), "--seed", "3"], env={**env, "SLURM_ARRAY_TASK_ID": "1"},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "args").read_text().split() == [
        "--ntasks-per-node=1", "/home/me/mlm-trainer/entrypoint.sh", "branch", "/runs/1/checkpoint-800",
        "--config", str(configs / "branch-1.yaml"), "--output_dir", "/runs/b/1", "--seed", "3",
    ]  # fmt: skip
    no_file = subprocess.run(["bash", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": "2"},
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert no_file.returncode == 2 and "branch-2.yaml: no such file" in no_file.stderr
    no_array = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert no_array.returncode == 2 and "SLURM_ARRAY_TASK_ID: unset" in no_array.stderr


@pytest.mark.parametrize(
    ("exit_code", "restarts", "requeued"),
    [(75, "5", "preempted (exit 75)"), (76, "2", "hung (exit 76"), (76, "3", None), (1, "0", None), (2, "0", None)],
)
def test_the_train_script_requeues_a_preempted_job_and_a_hung_one_a_bounded_number_of_times(
    tmp_path, exit_code, restarts, requeued
):
    """slurm/train.sbatch with srun exiting as the launchers did and scontrol standing in: 75 requeued always,
    76 (hung) while the job was restarted fewer than 3 times, anything else never; the script exits with the code."""
    script = Path(__file__).resolve().parents[2] / "slurm" / "train.sbatch"
    (tmp_path / "srun").write_text(f"#!/bin/sh\nexit {exit_code}\n")
    (tmp_path / "scontrol").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SCONTROL_ARGS"\n')
    for tool in ("srun", "scontrol"):
        (tmp_path / tool).chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu01",
           "SLURM_RESTART_COUNT": restarts, "SCONTROL_ARGS": str(tmp_path / "requeue")}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == exit_code, done.stderr
    if requeued:
        assert f"mlm-trainer: {requeued}" in done.stderr and "requeueing job 7" in done.stderr
        assert (tmp_path / "requeue").read_text().split() == ["requeue", "7"]
    else:
        assert "requeueing" not in done.stderr and not (tmp_path / "requeue").exists()
