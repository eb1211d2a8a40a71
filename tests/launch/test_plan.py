"""Each environment contract (PyTorchJob, TrainJob, Indexed Job, elastic, GPUs, CPU), the global batch and the
environment errors, asserted through `plan`."""

from __future__ import annotations

import json
import re

import pytest

from tests.fakes import h100s, install, uuid_of
from tests.launch.common import PYTORCHJOB, STOP, job_flags, plan_ok, run_plan, torchrun_flags
from train.common.errors import run_main
from train.common.handoff import Handoff
from train.config import load_config
from train.launch import __main__ as launcher
from train.launch import decide, torchrun
from train.launch import plan as planning
from train.launch.inputs import Host
from train.machine import gpus


def test_single_gpu(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    document = plan_ok(monkeypatch, capsys, base_env)
    assert torchrun_flags(document) == [
        "--nnodes", "1", "--nproc-per-node", "1", "--standalone", "--max-restarts", "0", *STOP, "--local-ranks-filter", "0",
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
    # pad_to_multiple_of 1: a CPU has no tensor cores to round lengths for (decide.decide_pad_multiple).
    assert job_flags(document) == ["--use_cpu", "true", "--ddp_backend", "gloo", "--pad_to_multiple_of", "1"]
    assert (document["backend"], document["precision"], document["tf32"]) == ("gloo", "fp32", False)
    assert document["gpus"] == [] and document["cpu_mode"] is True
    assert (document["sharding"]["requested"], document["sharding"]["smallest_gpu_memory_bytes"]) == ("ddp", None)
    assert document["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert document["warnings"][0].startswith("no GPU visible: CPU mode (no NVIDIA driver")
    assert document["batch"] == "batch: 32 per device x 1 process x 1 node x 1 accumulation = 32 global"


@pytest.mark.parametrize("rank", [0, 1])
def test_pytorchjob_master_and_worker(monkeypatch, capsys, base_env, rank):
    install(monkeypatch, h100s(8))
    env = {**base_env, **PYTORCHJOB, "PET_NODE_RANK": str(rank), "RANK": str(rank)}
    document = plan_ok(monkeypatch, capsys, env)
    assert torchrun_flags(document) == [
        "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", str(rank),
        "--master-addr", "mlm-master-0", "--master-port", "23456", "--rdzv-conf", "timeout=900",
        "--max-restarts", "0", *STOP, "--local-ranks-filter", "0",
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
        "--rdzv-conf", "join_timeout=900,last_call_timeout=5", "--max-restarts", "3", *STOP, "--local-ranks-filter", "0",
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

    monkeypatch.setattr(torchrun.subprocess, "Popen", no_torchrun)
    code = run_main(lambda argv: launcher.main(argv, {**base_env, "MLM_NUM_TRAIN_EPOCHS": "many"}), ["train"])
    assert code == 2
    assert "MLM_NUM_TRAIN_EPOCHS='many'" in capsys.readouterr().err


def test_unknown_command(monkeypatch, capsys, base_env):
    assert run_main(lambda argv: launcher.main(argv, base_env), ["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_secret_flags_leave_the_command_for_the_ranks_environment(monkeypatch, capsys, base_env, no_nvml):
    document = plan_ok(monkeypatch, capsys, base_env, "--hub_token", "hf_canary_1", "--seed", "7")
    assert "hf_canary" not in json.dumps(document)
    assert job_flags(document)[:2] == ["--seed", "7"]  # the token is no flag of torchrun or a rank
    assert document["config"]["hub_token"] == "***"
    config = load_config(["--hub_token=hf_canary_2"], base_env)
    plan = planning.make_plan(config, Host(gpus.detect({})), {}, ["--hub_token=hf_canary_2"])
    assert plan.secret_env == {"MLM_HUB_TOKEN": "hf_canary_2"} and "hf_canary_2" not in repr(plan)
    env = torchrun._child_env({}, plan, "/x")
    assert env["MLM_HUB_TOKEN"] == "hf_canary_2" and not any("hf_canary" in arg for arg in plan.command)


def test_split_secret_flags_takes_both_spellings_and_keeps_the_rest_in_order():
    kept, secrets = planning.split_secret_flags(["--seed", "7", "--hub_token", "a", "--x=1", "--hub_token=b", "y"])
    assert kept == ["--seed", "7", "--x=1", "y"]
    assert secrets == {"MLM_HUB_TOKEN": "b"}  # the last one wins, as argparse would take it
    assert planning.split_secret_flags(["--hub_token"]) == ([], {"MLM_HUB_TOKEN": ""})  # no value: an empty token


def test_the_decided_values_are_the_decision_flags_read_back():
    flags = ["--log_format", "text", "--use_cpu", "true", "--ddp_backend", "gloo", "--gradient_accumulation_steps", "4"]
    assert planning.option_values(flags) == {
        "log_format": "text", "use_cpu": True, "ddp_backend": "gloo", "gradient_accumulation_steps": 4,
    }  # fmt: skip


def test_cpu_plan_decides_in_order_and_shows_the_values(monkeypatch, capsys, base_env, no_nvml):
    document = plan_ok(monkeypatch, capsys, {**base_env, "MLM_LOG_FORMAT": "auto", "MLM_GLOBAL_BATCH_SIZE": "64"})
    assert job_flags(document)[0] == "--log_format" and job_flags(document)[2:] == [
        "--use_cpu", "true", "--ddp_backend", "gloo", "--gradient_accumulation_steps", "2", "--pad_to_multiple_of", "1",
    ]  # fmt: skip
    config = document["config"]
    assert (config["use_cpu"], config["ddp_backend"], config["gradient_accumulation_steps"]) == (True, "gloo", 2)
    assert config["pad_to_multiple_of"] == 1 and config["log_format"] == job_flags(document)[1]


@pytest.mark.parametrize(
    ("shm", "workers", "warns"),
    [(64 * 2**20, 2, True), (None, 1, True), (64 * 2**20, 0, False), (2 * 2**30, 4, False)],
)
def test_shm_warning(shm, workers, warns):
    warning = decide.shm_warning(shm, workers)
    assert (warning is not None) == warns
    if warns:
        assert "--ipc=host" in warning and "--shm-size" in warning and "emptyDir" in warning


def test_small_shm_reaches_the_plan_warnings(no_nvml):
    config = load_config([], {"MLM_DATALOADER_NUM_WORKERS": "2"})
    plan = planning.make_plan(config, Host(gpus.detect({}), shm_bytes=64 * 2**20), {}, [])
    assert any("/dev/shm is only 64 MiB" in w for w in plan.warnings)


def test_the_ranks_are_handed_the_decisions(monkeypatch, capsys, base_env):
    """MLM_LAUNCH carries what the banner, run.json and the GPU sampler show, so no rank works it out again."""
    install(monkeypatch, h100s(4))
    env = {**base_env, "NVIDIA_VISIBLE_DEVICES": f"{uuid_of(1)},{uuid_of(3)}", "MLM_GLOBAL_BATCH_SIZE": "128"}
    document = plan_ok(monkeypatch, capsys, env)
    handoff = Handoff.from_environ({"MLM_LAUNCH": document["env"]["MLM_LAUNCH"]})
    assert handoff is not None
    assert handoff.gpu_uuids == [uuid_of(1), uuid_of(3)] == document["env"]["CUDA_VISIBLE_DEVICES"].split(",")
    assert handoff.gpus == ["NVIDIA H100 80GB HBM3"] * 2 and handoff.nnodes == "1"
    assert (handoff.precision, handoff.global_batch_size) == ("bf16 + tf32", 128)
    assert handoff.batch == document["batch"] and handoff.command == document["command"]
    memory = document["gpus"][0]["memory_total_bytes"]  # what MLM_SHARDING=auto fits DDP into
    assert handoff.gpu_memory_bytes == memory == document["sharding"]["smallest_gpu_memory_bytes"] > 0
    assert Handoff.from_environ({}) is None and Handoff.from_environ({"MLM_LAUNCH": "not json"}) is None


def test_stop_timeout_reaches_torchrun(monkeypatch, capsys, base_env, no_nvml):
    """torchrun's own default would SIGKILL the ranks 30 s after forwarding SIGTERM, whatever the grace period."""
    flags = torchrun_flags(plan_ok(monkeypatch, capsys, {**base_env, "MLM_STOP_TIMEOUT": "600"}))
    assert flags[flags.index("--shutdown-timeout") + 1] == "600"
    assert flags[flags.index("--signals-to-handle") + 1].split(",")[-2:] == ["SIGUSR1", "SIGUSR2"]


def test_plan_reports_a_finished_model_instead_of_refusing(monkeypatch, capsys, base_env, no_nvml, tmp_path):
    """A dry run never refuses for what it finds in output_dir: it says what a run would do."""
    (tmp_path / "out" / "final").mkdir(parents=True)
    document = plan_ok(monkeypatch, capsys, base_env)
    assert document["output_dir"]["finished_model"] is True
    assert document["output_dir"]["a run would"].startswith("refuse: it holds a finished model")
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, "MLM_OVERWRITE_OUTPUT_DIR": "true"})
    assert code == 0
    assert (tmp_path / "out" / "final").exists()  # a plan changes nothing
    code = run_main(lambda argv: launcher.main(argv, base_env), ["train"])
    assert code == 2 and "holds a finished model in final/" in capsys.readouterr().err


# About 6.6 B parameters: 105 GB of DDP state, more than 85 % of an 80 GB GPU (built on the meta device: no memory).
LARGE = "num_hidden_layers=32,hidden_size=4096,num_attention_heads=32,intermediate_size=16384"


@pytest.mark.parametrize(
    ("overrides", "mode"),
    [(LARGE, "fsdp"), ("num_hidden_layers=2,hidden_size=64,num_attention_heads=2,intermediate_size=128", "ddp")],
)
def test_plan_says_what_auto_will_shard(monkeypatch, capsys, base_env, overrides, mode):
    install(monkeypatch, h100s(8))
    env = {**base_env, "MLM_SHARDING": "auto", "MLM_MODEL_NAME_OR_PATH": "scratch:bert",
           "MLM_CONFIG_OVERRIDES": overrides, "MLM_TOKENIZER_VOCAB_SIZE": "30522"}  # fmt: skip
    sharding = plan_ok(monkeypatch, capsys, env)["sharding"]
    assert sharding["mode"] == mode and sharding["choice"].startswith(f"{mode} (auto: ")
    assert sharding["smallest_gpu_memory_bytes"] > 70 * 2**30
    if mode == "fsdp":
        assert (
            sharding["ddp_estimate"]["parameters"] > 6e9 and "more than 85% of the smallest GPU's" in sharding["choice"]
        )


def test_plan_leaves_the_choice_to_the_ranks_when_the_models_config_is_not_here(monkeypatch, capsys, base_env, no_nvml):
    env = {**base_env, "MLM_SHARDING": "auto"}  # the default model, distilbert-base-uncased: not downloaded here
    sharding = plan_ok(monkeypatch, capsys, env)["sharding"]
    assert sharding["ddp_estimate"] is None and sharding["mode"] is None
    assert sharding["choice"].startswith("decided by the ranks")
