"""Launch decisions: each environment contract asserted through `plan`, and the pure deciding functions."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest

from tests.conftest import REPO
from tests.test_gpus import FakeDevice, FakeNvml, h100s, install, uuid_of
from train import launch
from train.config import load_config
from train.errors import ConfigError, EnvironmentProblem, UserError, run_main


def gpus_of(cc: tuple[int, int], n: int = 1, name: str = "GPU") -> FakeNvml:
    return FakeNvml([FakeDevice(uuid_of(i), name=name, cc=cc) for i in range(n)])


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    # log_format fixed: `auto` would be resolved on pytest's captured stdout and add a flag to every command.
    return {"MLM_OUTPUT_DIR": str(tmp_path / "out"), "MLM_LOG_FORMAT": "text"}


@pytest.fixture
def no_nvml(monkeypatch):
    install(monkeypatch, init_error=pynvml.NVMLError_LibraryNotFound)


def run_plan(monkeypatch, capsys, env, *flags, torch_cuda=None):
    """``python -m train.launch plan`` in-process: (exit code, the JSON document or None, stderr)."""
    monkeypatch.setattr(launch, "torch_cuda_version", lambda: torch_cuda)
    code = run_main(lambda argv: launch.main(argv, env), ["plan", *flags])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def plan_ok(monkeypatch, capsys, env, *flags, torch_cuda=None) -> dict:
    code, document, err = run_plan(monkeypatch, capsys, env, *flags, torch_cuda=torch_cuda)
    assert code == 0, err
    return document


def torchrun_flags(document: dict) -> list[str]:
    command = document["command"]
    assert command[0] == str(Path(sys.executable).with_name("torchrun"))
    return command[1 : command.index("-m")]


def job_flags(document: dict) -> list[str]:
    command = document["command"]
    assert command[command.index("-m") + 1] == "train.job"
    return command[command.index("-m") + 2 :]


# ---- each environment contract, through plan ---------------------------------------------------------------------


def test_single_gpu(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    document = plan_ok(monkeypatch, capsys, base_env)
    assert torchrun_flags(document) == [
        "--nnodes", "1", "--nproc-per-node", "1", "--standalone", "--max-restarts", "0", "--local-ranks-filter", "0",
    ]  # fmt: skip
    assert job_flags(document) == ["--ddp_backend", "nccl", "--bf16", "true", "--tf32", "true"]
    assert (document["nproc_per_node"], document["nnodes"], document["node_rank"]) == (1, 1, 0)
    assert (document["backend"], document["precision"], document["tf32"]) == ("nccl", "bf16", True)
    assert document["gpus"][0]["uuid"] == uuid_of(0) and document["gpus"][0]["compute_capability"] == "9.0"
    assert document["env"]["CUDA_VISIBLE_DEVICES"] == uuid_of(0)
    assert document["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert document["config"]["bf16"] is True and document["config"]["ddp_backend"] == "nccl"
    assert document["warnings"] == []


def test_eight_gpus(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(8))
    document = plan_ok(monkeypatch, capsys, base_env)
    assert torchrun_flags(document)[:5] == ["--nnodes", "1", "--nproc-per-node", "8", "--standalone"]
    assert document["world_size"] == 8 and document["global_batch_size"] == 256
    assert document["batch"] == "batch: 32 per device x 8 GPUs x 1 node x 1 accumulation = 256 global"
    assert document["env"]["CUDA_VISIBLE_DEVICES"].split(",") == [uuid_of(i) for i in range(8)]


def test_cpu(monkeypatch, capsys, base_env, no_nvml):
    document = plan_ok(monkeypatch, capsys, base_env)
    assert torchrun_flags(document)[:5] == ["--nnodes", "1", "--nproc-per-node", "1", "--standalone"]
    # use_cpu: without it accelerate gives CPU ranks a process group but no DDP.
    assert job_flags(document) == ["--use_cpu", "true", "--ddp_backend", "gloo"]
    assert (document["backend"], document["precision"], document["tf32"]) == ("gloo", "fp32", False)
    assert document["gpus"] == [] and document["cpu_mode"] is True
    assert document["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert document["warnings"][0].startswith("no GPU visible: CPU mode (no NVIDIA driver")
    assert document["batch"] == "batch: 32 per device x 1 process x 1 node x 1 accumulation = 32 global"


PYTORCHJOB = {  # what training-operator (>= 1.7) sets on a PyTorchJob's pods, master 0 / workers 1..
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "auto",
    "MASTER_ADDR": "mlm-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
}


@pytest.mark.parametrize("rank", [0, 1])
def test_pytorchjob_master_and_worker(monkeypatch, capsys, base_env, rank):
    install(monkeypatch, h100s(8))
    env = {**base_env, **PYTORCHJOB, "PET_NODE_RANK": str(rank), "RANK": str(rank)}
    document = plan_ok(monkeypatch, capsys, env)
    assert torchrun_flags(document) == [
        "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", str(rank),
        "--master-addr", "mlm-master-0", "--master-port", "23456", "--rdzv-conf", "timeout=900",
        "--max-restarts", "0", "--local-ranks-filter", "0",
    ]  # fmt: skip
    assert (document["nnodes"], document["node_rank"], document["world_size"]) == (2, rank, 16)
    assert document["rendezvous"]["mode"] == "static"
    assert document["topology_sources"]["master_addr"] == "MASTER_ADDR"
    assert document["batch"] == "batch: 32 per device x 8 GPUs x 2 nodes x 1 accumulation = 512 global"


def test_trainjob_v2(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(4))
    env = {
        **base_env,
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "auto",
        "PET_NODE_RANK": "2",
        "JOB_COMPLETION_INDEX": "2",
        "PET_MASTER_ADDR": "mlm-node-0-0.mlm",
        "PET_MASTER_PORT": "29400",
    }
    document = plan_ok(monkeypatch, capsys, env)
    assert torchrun_flags(document)[:10] == [
        "--nnodes", "3", "--nproc-per-node", "4", "--node-rank", "2",
        "--master-addr", "mlm-node-0-0.mlm", "--master-port", "29400",
    ]  # fmt: skip
    assert document["topology_sources"] == {
        "nnodes": "PET_NNODES",
        "node_rank": "PET_NODE_RANK",
        "master_addr": "PET_MASTER_ADDR",
        "master_port": "PET_MASTER_PORT",
    }
    assert document["world_size"] == 12


def test_elastic(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    env = {
        **base_env,
        "PET_RDZV_ENDPOINT": "mlm-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": "1:4",
        "PET_MAX_RESTARTS": "3",
        "PET_NPROC_PER_NODE": "1",
        "PET_RDZV_CONF": "last_call_timeout=5",
    }
    document = plan_ok(monkeypatch, capsys, env)
    assert torchrun_flags(document) == [
        "--nnodes", "1:4", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "mlm-worker-0:23456", "--rdzv-id", "mlm-trainer",
        "--rdzv-conf", "join_timeout=900,last_call_timeout=5", "--max-restarts", "3", "--local-ranks-filter", "0",
    ]  # fmt: skip
    assert document["nnodes"] == "1:4" and document["world_size"] is None
    assert document["global_batch_size"] is None
    assert document["batch"] == "batch: 32 per device x 1 GPU x 1-4 nodes x 1 accumulation = 32-128 global"


def test_indexed_job(monkeypatch, capsys, base_env, no_nvml):
    env = {**base_env, "NNODES": "3", "JOB_COMPLETION_INDEX": "2", "MASTER_ADDR": "mlm-0.mlm", "MASTER_PORT": "29500"}
    document = plan_ok(monkeypatch, capsys, env)
    assert torchrun_flags(document)[:10] == [
        "--nnodes", "3", "--nproc-per-node", "1", "--node-rank", "2",
        "--master-addr", "mlm-0.mlm", "--master-port", "29500",
    ]  # fmt: skip
    assert document["topology_sources"]["node_rank"] == "JOB_COMPLETION_INDEX"
    assert document["world_size"] == 3


# ---- topology rules ------------------------------------------------------------------------------------------------


def test_pet_variables_win_over_torch_ones():
    topology = launch.topology_from_env(
        {"PET_NNODES": "2", "NNODES": "5", "PET_NODE_RANK": "1", "NODE_RANK": "4", "MASTER_ADDR": "m", "NODE_X": "y"}
    )
    assert (topology.nnodes, topology.node_rank, topology.mode) == ("2", 1, "static")
    assert topology.address_to_wait_for == ("m", "MASTER_ADDR")
    static_endpoint = launch.topology_from_env(
        {"NNODES": "2", "NODE_RANK": "1", "PET_RDZV_BACKEND": "static", "PET_RDZV_ENDPOINT": "host-0:29500"}
    )
    assert static_endpoint.mode == "static" and static_endpoint.address_to_wait_for == ("host-0", "PET_RDZV_ENDPOINT")


def test_node_rank_env_wins_over_completion_index_and_single_node_ignores_it():
    topology = launch.topology_from_env(
        {"NNODES": "2", "NODE_RANK": "0", "JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "m"}
    )
    assert topology.node_rank == 0 and topology.address_to_wait_for is None  # node 0 hosts the store
    single = launch.topology_from_env({"JOB_COMPLETION_INDEX": "3"})
    assert (single.mode, single.node_rank) == ("standalone", 0)


def test_elastic_range_without_endpoint_meets_at_the_master():
    topology = launch.topology_from_env({"PET_NNODES": "2:4", "MASTER_ADDR": "m", "MASTER_PORT": "1234"})
    assert (topology.mode, topology.rdzv_backend, topology.rdzv_endpoint) == ("dynamic", "c10d", "m:1234")
    assert topology.address_to_wait_for == ("m", "MASTER_ADDR")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NNODES": "2"}, "needs the address of node 0"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "m"}, r"NODE_RANK=2: expected 0\.\.1"),
        ({"PET_NNODES": "two"}, "PET_NNODES='two': expected an integer"),
        ({"PET_NNODES": "4:2", "MASTER_ADDR": "m"}, "min <= max"),
        ({"PET_NNODES": "1:4"}, "PET_RDZV_ENDPOINT or PET_MASTER_ADDR"),
        ({"NNODES": "2", "NODE_RANK": "-1", "MASTER_ADDR": "m"}, "NODE_RANK='-1'"),
        ({"PET_NODE_RANK": "1"}, "PET_NODE_RANK=1 but the job has one node"),
    ],
)
def test_topology_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        launch.topology_from_env(env)


def test_options_override_kubeflow_values(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(8))
    env = {
        **base_env,
        "PET_NPROC_PER_NODE": "2",
        "PET_MAX_RESTARTS": "3",
        "MLM_MAX_RESTARTS": "1",
        "MLM_LOG_RANKS": "all",
        "MLM_RDZV_TIMEOUT": "120",
        "NNODES": "2",
        "MASTER_ADDR": "m",
    }
    flags = torchrun_flags(plan_ok(monkeypatch, capsys, env))
    assert flags[flags.index("--nproc-per-node") + 1] == "2"
    assert flags[flags.index("--max-restarts") + 1] == "1"
    assert flags[flags.index("--rdzv-conf") + 1] == "timeout=120"
    assert "--local-ranks-filter" not in flags
    env["MLM_NPROC_PER_NODE"] = "4"
    env["MLM_LOG_RANKS"] = "0,1"
    document = plan_ok(monkeypatch, capsys, env)
    flags = torchrun_flags(document)
    assert flags[flags.index("--nproc-per-node") + 1] == "4"
    assert flags[flags.index("--local-ranks-filter") + 1] == "0,1"
    assert document["env"]["CUDA_VISIBLE_DEVICES"].split(",") == [uuid_of(i) for i in range(4)]


@pytest.mark.parametrize(
    ("requested", "pet", "gpus", "expected"),
    [
        (None, None, 8, 8),
        (None, None, 0, 1),
        ("auto", None, 2, 2),
        (None, "auto", 0, 1),
        (None, "gpu", 4, 4),
        (None, "cpu", 0, 16),
        (None, "3", 8, 3),
        ("2", "3", 8, 2),
        ("4", None, 0, 4),  # several CPU processes when asked for
    ],
)
def test_decide_nproc(requested, pet, gpus, expected):
    assert launch.decide_nproc(requested, "MLM_NPROC_PER_NODE", pet, gpus, cpu_count=16)[0] == expected


def test_decide_nproc_errors():
    with pytest.raises(ConfigError, match="only 8 GPU"):
        launch.decide_nproc("16", "MLM_NPROC_PER_NODE", None, 8, 4)
    with pytest.raises(EnvironmentProblem, match="PET_NPROC_PER_NODE=gpu but no GPU"):
        launch.decide_nproc(None, "x", "gpu", 0, 4)
    with pytest.raises(ConfigError, match="PET_NPROC_PER_NODE='many'"):
        launch.decide_nproc(None, "x", "many", 0, 4)


# ---- precision -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cc", "precision", "flags"),
    [
        ((9, 0), "bf16", ["--bf16", "true", "--tf32", "true"]),
        ((8, 0), "bf16", ["--bf16", "true", "--tf32", "true"]),
        ((7, 5), "fp16", ["--fp16", "true"]),
        ((7, 0), "fp16", ["--fp16", "true"]),
        ((6, 0), "fp32", []),
    ],
)
def test_precision_from_the_hardware(monkeypatch, capsys, base_env, cc, precision, flags):
    install(monkeypatch, gpus_of(cc))
    document = plan_ok(monkeypatch, capsys, base_env)
    assert document["precision"] == precision
    assert job_flags(document) == ["--ddp_backend", "nccl", *flags]


def test_mixed_gpus_use_the_weakest(monkeypatch, capsys, base_env):
    fake = FakeNvml([FakeDevice(uuid_of(0), cc=(8, 0)), FakeDevice(uuid_of(1), cc=(7, 0))])
    install(monkeypatch, fake)
    assert plan_ok(monkeypatch, capsys, base_env)["precision"] == "fp16"


def test_user_fp16_on_cpu_is_an_error(monkeypatch, capsys, base_env, no_nvml):
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, "MLM_FP16": "true"})
    assert code == 2
    assert "MLM_FP16: fp16 needs a GPU" in err


def test_user_fp16_on_ampere_is_kept(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    document = plan_ok(monkeypatch, capsys, {**base_env, "MLM_FP16": "true"})
    assert (document["precision"], document["precision_source"]) == ("fp16", "MLM_FP16")
    assert job_flags(document) == ["--ddp_backend", "nccl", "--tf32", "true"]


def test_decide_precision_checks_what_the_user_asked_for():
    # (The launcher's own TrainingArguments would already refuse bf16/tf32 without CUDA, so these are unit tests.)
    with pytest.raises(
        ConfigError, match=r"--bf16: bf16 needs compute capability 8\.0 or newer, not compute capability 7\.0"
    ):
        launch.decide_precision(False, True, None, {"bf16": "--bf16"}, (7, 0))
    with pytest.raises(ConfigError, match="MLM_TF32: tf32 needs compute capability 8.0"):
        launch.decide_precision(False, False, True, {"tf32": "MLM_TF32"}, (7, 5))
    with pytest.raises(ConfigError, match="tf32 needs compute capability 8.0 or newer, not the CPU"):
        launch.decide_precision(False, False, True, {"tf32": "MLM_TF32"}, None)
    kept = launch.decide_precision(False, True, None, {"bf16": "job.yaml: bf16"}, (8, 6))
    assert (kept.name, kept.flags, kept.source) == ("bf16", ("--tf32", "true"), "job.yaml: bf16")
    # An explicit "no" is a choice too.
    off = launch.decide_precision(False, False, False, {"bf16": "--bf16", "tf32": "--tf32"}, (9, 0))
    assert (off.name, off.tf32, off.flags) == ("fp32", False, ())
    assert launch.decide_precision(False, True, None, {"bf16": "--bf16"}, None).name == "bf16"  # CPU autocast


# ---- global batch --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nnodes", "accumulation"), [("1", 4), ("2", 2), ("4", 1)])
def test_global_batch_sets_accumulation(monkeypatch, capsys, base_env, nnodes, accumulation):
    install(monkeypatch, h100s(8))
    env = {**base_env, "MLM_GLOBAL_BATCH_SIZE": "1024", "NNODES": nnodes, "MASTER_ADDR": "m"}
    document = plan_ok(monkeypatch, capsys, env)
    assert document["gradient_accumulation_steps"] == accumulation
    assert job_flags(document)[-2:] == ["--gradient_accumulation_steps", str(accumulation)]
    assert document["config"]["gradient_accumulation_steps"] == accumulation
    plural = "s" if nnodes != "1" else ""
    assert document["batch"] == (
        f"batch: 32 per device x 8 GPUs x {nnodes} node{plural} x {accumulation} accumulation = 1024 global"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MLM_GLOBAL_BATCH_SIZE": "1000"}, r"MLM_GLOBAL_BATCH_SIZE=1000: not a multiple of 32 per device x 8 GPUs x 1 node = 256; use 768 or 1024"),
        ({"MLM_GLOBAL_BATCH_SIZE": "128"}, r"use 256; or per_device_train_batch_size=16"),
        ({"MLM_GLOBAL_BATCH_SIZE": "1024", "MLM_GRADIENT_ACCUMULATION_STEPS": "2"}, "MLM_GRADIENT_ACCUMULATION_STEPS=2 contradicts"),
        ({"MLM_GLOBAL_BATCH_SIZE": "1024", "PET_NNODES": "1:2", "MASTER_ADDR": "m"}, "elastic"),
    ],
)  # fmt: skip
def test_global_batch_errors(monkeypatch, capsys, base_env, env, message):
    install(monkeypatch, h100s(8))
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, **env})
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("mlm-trainer: error: ")
    assert re.search(message, err), err


def test_global_batch_agreeing_with_explicit_accumulation(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(8))
    env = {**base_env, "MLM_GLOBAL_BATCH_SIZE": "1024", "MLM_GRADIENT_ACCUMULATION_STEPS": "4"}
    document = plan_ok(monkeypatch, capsys, env)
    assert document["gradient_accumulation_steps"] == 4
    assert "--gradient_accumulation_steps" not in job_flags(document)


# ---- environment errors and checks ---------------------------------------------------------------------------------


def test_require_gpu_without_gpu_exits_3(monkeypatch, capsys, base_env, no_nvml):
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, "MLM_REQUIRE_GPU": "true"})
    assert code == 3
    assert "MLM_REQUIRE_GPU asks for a GPU but none is used: no NVIDIA driver" in err


def test_require_gpu_with_gpu_is_fine(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    assert plan_ok(monkeypatch, capsys, {**base_env, "MLM_REQUIRE_GPU": "true"})["nproc_per_node"] == 1


def test_driver_too_old_exits_3(monkeypatch, capsys, base_env):
    fake = h100s(1)
    fake.cuda = 11080
    install(monkeypatch, fake)
    code, _, err = run_plan(monkeypatch, capsys, base_env, torch_cuda="12.8")
    assert code == 3
    assert "CUDA 11.8" in err and "CUDA 12.8" in err


def test_output_dir_not_writable_exits_3(monkeypatch, capsys, base_env, no_nvml, tmp_path):
    (tmp_path / "a-file").write_text("")
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, "MLM_OUTPUT_DIR": str(tmp_path / "a-file" / "out")})
    assert code == 3
    assert "MLM_OUTPUT_DIR" in err and "not writable" in err


def test_config_error_exits_2_before_torchrun(monkeypatch, capsys, base_env, no_nvml):
    def no_torchrun(*args, **kwargs):
        raise AssertionError("torchrun must not start on a config error")

    monkeypatch.setattr(launch.subprocess, "Popen", no_torchrun)
    code = run_main(lambda argv: launch.main(argv, {**base_env, "MLM_NUM_TRAIN_EPOCHS": "many"}), ["train"])
    assert code == 2
    assert "MLM_NUM_TRAIN_EPOCHS='many'" in capsys.readouterr().err


def test_unknown_command(monkeypatch, capsys, base_env):
    assert run_main(lambda argv: launch.main(argv, base_env), ["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_secrets_are_redacted_in_the_plan(monkeypatch, capsys, base_env, no_nvml):
    document = plan_ok(monkeypatch, capsys, base_env, "--hub_token", "hf_canary_1", "--hub_token=hf_canary_2")
    text = json.dumps(document)
    assert "hf_canary" not in text
    assert job_flags(document)[:3] == ["--hub_token", "***", "--hub_token=***"]
    assert document["config"]["hub_token"] == "***"


@pytest.mark.parametrize(
    ("shm", "workers", "warns"),
    [(64 * 2**20, 2, True), (None, 1, True), (64 * 2**20, 0, False), (2 * 2**30, 4, False)],
)
def test_shm_warning(shm, workers, warns):
    warning = launch.shm_warning(shm, workers)
    assert (warning is not None) == warns
    if warns:
        assert "--ipc=host" in warning and "--shm-size" in warning and "emptyDir" in warning


def test_small_shm_reaches_the_plan_warnings(no_nvml):
    config = load_config([], {"MLM_DATALOADER_NUM_WORKERS": "2"})
    plan = launch.make_plan(config, launch.detect({}), {}, [], shm_bytes=64 * 2**20)
    assert any("/dev/shm is only 64 MiB" in w for w in plan.warnings)


def test_wait_for_address_retries_then_resolves():
    answers = [OSError("Name or service not known")] * 2 + [None]
    slept, logged = [], []

    def resolve(host):
        answer = answers.pop(0)
        if answer:
            raise answer

    failures = launch.wait_for_address("mlm-master-0", "MASTER_ADDR", 60, logged.append, resolve, slept.append)
    assert failures == 2 and slept == [1.0, 2.0]
    assert "waiting for MASTER_ADDR=mlm-master-0 to resolve (attempt 1" in logged[0]
    assert "resolves now" in logged[-1]


def test_wait_for_address_is_bounded():
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    def resolve(host):
        raise OSError("Name or service not known")

    with pytest.raises(UserError, match=r"MASTER_ADDR='nowhere' did not resolve within 30s") as caught:
        launch.wait_for_address("nowhere", "MASTER_ADDR", 30, lambda m: None, resolve, sleep, lambda: now[0])
    assert caught.value.exit_code == 1  # retried by the Job controller, unlike exit 3
    assert now[0] == 30


# ---- running torchrun: environment, exit codes, signals ------------------------------------------------------------


@pytest.fixture
def cpu_plan(no_nvml, tmp_path) -> launch.Plan:
    config = load_config([], {"MLM_OUTPUT_DIR": str(tmp_path / "out")})
    return launch.make_plan(config, launch.detect({}), {}, [])


def fake_torchrun(plan: launch.Plan, script: str) -> launch.Plan:
    return dataclasses.replace(plan, command=[sys.executable, "-c", script])


def test_child_env_drops_pet_variables_and_sets_the_decisions(cpu_plan):
    env = launch._child_env({"PET_STANDALONE": "", "PET_NNODES": "2", "KEEP": "1"}, cpu_plan, "/x")
    assert not [k for k in env if k.startswith("PET_")]
    assert env["KEEP"] == "1" and env["MLM_EXIT_DIR"] == "/x"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == ""


RECORD = "import os, sys; open(os.path.join(os.environ['MLM_EXIT_DIR'], 'rank-{rank}.exit'), 'w').write('{code}'); "


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("import sys; sys.exit(0)", 0),
        (RECORD.format(rank=1, code=75) + "sys.exit(1)", 75),  # a preempted rank: torchrun says 1, we say 75
        (RECORD.format(rank=0, code=2) + "sys.exit(1)", 2),
        (RECORD.format(rank=3, code=3) + "sys.exit(1)", 3),
        ("import sys; sys.exit(1)", 1),  # a crash: no documented code
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
    ],
)
def test_exit_codes_are_translated(cpu_plan, script, expected):
    assert launch.launch(fake_torchrun(cpu_plan, script), {}, lambda *a: None, 10) == expected


def test_sigterm_is_forwarded_to_torchrun(cpu_plan, tmp_path):
    ready = tmp_path / "ready"
    script = (
        "import os, signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    open(os.path.join(os.environ['MLM_EXIT_DIR'], 'rank-0.exit'), 'w').write('75')\n"
        "    sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
        "sys.exit(9)\n"
    )

    def terminate_when_ready():
        for _ in range(600):
            if ready.exists():
                os.kill(os.getpid(), signal.SIGTERM)  # as docker stop / the kubelet would, to the launcher
                return
            time.sleep(0.05)

    logged = []
    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_when_ready, daemon=True).start()
    assert launch.launch(fake_torchrun(cpu_plan, script), {}, lambda m, *a: logged.append(m), 10) == 75
    assert any("SIGTERM received: passing it to torchrun" in m for m in logged)
    assert signal.getsignal(signal.SIGTERM) == before  # the launcher's handler is gone once torchrun is


# ---- through the real entry points ---------------------------------------------------------------------------------


def entry_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLM_", "PET_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **extra)
    env["MLM_OUTPUT_DIR"] = str(tmp_path / "out")
    return env


def test_entrypoint_plan_for_a_pytorchjob_worker(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    # A PyTorchJob pod also carries WORLD_SIZE/RANK; with use_cpu the launcher's own TrainingArguments would
    # start a process group with them and wait forever for rank 0 (the launcher must load the config as a launcher).
    worker = {**PYTORCHJOB, "PET_NODE_RANK": "1", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    env = entry_env(tmp_path, **worker, MLM_USE_CPU="true")
    result = subprocess.run(
        [str(REPO / "entrypoint.sh"), "plan"], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert (document["nnodes"], document["node_rank"], document["backend"]) == (2, 1, "gloo")
    assert "--node-rank" in document["command"] and document["config"]["use_cpu"] is True


def test_entrypoint_gpus_without_a_driver(tmp_path):
    result = subprocess.run(
        [str(REPO / "entrypoint.sh"), "gpus"], env=entry_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no GPU visible: CPU mode (")
