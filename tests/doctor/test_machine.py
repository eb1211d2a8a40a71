"""The machine rows through the one NVML fake and a faked torch.cuda: GPUs, driver, torch.cuda, /dev/shm and the
launcher's plan (processes, or the launcher's refusal)."""

from __future__ import annotations

import pytest
import torch

from tests.doctor.helpers import GIB, checks, fast_nccl
from tests.fakes import FakeDevice, FakeNvml, h100s, install, no_driver, uuid_of
from tests.helpers import threads_in_the_probe, torch_threads
from train.doctor import machine
from train.launch.plan import launcher_config
from train.machine import resources
from train.machine.gpus import Inventory

# ---- gpus and driver ---------------------------------------------------------------------------------------------


def test_healthy_gpus(env, monkeypatch):
    install(monkeypatch, h100s(2))
    calls = fast_nccl(monkeypatch)
    found = checks(monkeypatch, cuda="12.4", count=2)
    assert found["gpus"].status == "OK" and "2 × NVIDIA H100 80GB HBM3 (80 GiB)" in found["gpus"].detail
    assert "driver 550.54.15" in found["gpus"].detail
    assert found["gpus"].data["uuids"] == [uuid_of(0), uuid_of(1)]
    assert found["driver"].status == "OK" and "CUDA 12.4" in found["driver"].detail
    assert found["torch.cuda"].status == "OK"
    assert found["nccl"].status == "OK" and "150.0 GB/s" in found["nccl"].detail and calls == [2]
    assert [c for c in found.values() if c.status not in ("OK", "SKIP")] == []


def test_the_peak_row_gives_what_mfu_is_a_share_of(env, monkeypatch):
    install(monkeypatch, h100s(2))
    fast_nccl(monkeypatch)
    found = checks(monkeypatch, cuda="12.4", count=2)["peak (MFU)"]
    assert found.status == "OK" and found.data["flops"] == 989.4e12 and "H100's datasheet, dense bf16" in found.detail


def test_the_peak_row_of_a_cpu_is_measured(env, monkeypatch):
    no_driver(monkeypatch)
    found = checks(monkeypatch)["peak (MFU)"]  # a CPU: measured, then cached in HF_HOME
    assert found.status == "OK" and found.data["flops"] > 0 and "measured" in found.data["source"]


def test_the_peak_row_of_a_cpu_is_measured_on_the_plans_threads_and_torchs_own_kept(env, monkeypatch):
    """The ranks' rule (peaks.device_peak) on the threads the plan gives a rank, not on doctor's own: the figure is
    measured on the count its source names, and doctor's process keeps its thread count."""
    no_driver(monkeypatch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the plan sets it then
    monkeypatch.setattr(machine, "usable_cpus", lambda: 3)  # one rank on CPU: OMP_NUM_THREADS=3
    seen = threads_in_the_probe(monkeypatch)
    with torch_threads(1):
        found = checks(monkeypatch)["peak (MFU)"]
        assert torch.get_num_threads() == 1
    assert found.status == "OK" and "(3 threads" in found.data["source"]
    assert seen and set(seen) == {3}


def test_driver_for_an_older_cuda_major_fails(env, monkeypatch):
    install(monkeypatch, FakeNvml(h100s(1).devices, driver="520.61.05", cuda=11080))
    found = checks(monkeypatch, cuda="12.4", count=0)
    assert found["driver"].status == "FAIL" and "too old" in found["driver"].detail
    assert ">= 525.60.13" in found["driver"].detail
    assert found["torch.cuda"].status == "FAIL" and "driver too old" in found["torch.cuda"].detail
    # The launcher refuses for the same reason: the plan row carries its message.
    assert found["plan"].status == "FAIL" and "too old" in found["plan"].detail


def test_older_minor_cuda_version_warns_once(env, monkeypatch):
    install(monkeypatch, FakeNvml(h100s(1).devices, cuda=12020))
    found = checks(monkeypatch, cuda="12.4", count=1)
    assert found["driver"].status == "WARN" and "minor-version compatibility" in found["driver"].detail
    # The plan carries the same warning; the processes row leaves it to the driver row.
    assert found["processes"].status == "OK"
    assert found["driver"].detail in found["processes"].data["warnings"]


def test_cpu_build_of_torch_with_gpus_fails(env, monkeypatch):
    install(monkeypatch, h100s(1))
    found = checks(monkeypatch, cuda=None, count=0)
    assert found["driver"].status == "FAIL" and "CPU build" in found["driver"].detail
    assert "MLM_USE_CPU=true" in found["driver"].detail  # gpus.check_driver's own message


def test_no_driver_is_a_cpu_run(env, monkeypatch):
    no_driver(monkeypatch)
    found = checks()
    assert found["gpus"].status == "WARN" and "CPU mode (no NVIDIA driver" in found["gpus"].detail
    assert found["driver"].status == "SKIP" and found["torch.cuda"].status == "SKIP"
    assert found["processes"].status == "OK" and "backend gloo" in found["processes"].detail


def test_visibility_notes_are_shown(env, monkeypatch):
    install(monkeypatch, h100s(4))
    fast_nccl(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,bogus,2")
    found = checks(monkeypatch, count=1)
    assert found["gpus"].data["uuids"] == [uuid_of(0)]
    assert "'bogus' is not a visible device; CUDA stops there" in found["gpus"].detail
    assert found["torch.cuda"].status == "OK"


def test_mig_instances_replace_their_gpu(env, monkeypatch):
    mig = FakeDevice(uuid_of(0), mig=1, mig_instances=[("MIG-aaaa", "NVIDIA H100 MIG 1g.10gb", 10 * GIB)])
    install(monkeypatch, FakeNvml([mig]))
    found = checks(monkeypatch, count=1)
    assert found["gpus"].status == "OK" and "1 × NVIDIA H100 MIG 1g.10gb (10 GiB)" in found["gpus"].detail
    assert found["gpus"].data["uuids"] == ["MIG-aaaa"]


# ---- torch.cuda ----------------------------------------------------------------------------------------------------


def test_torch_sees_fewer_gpus_than_nvml_fails(env, monkeypatch):
    install(monkeypatch, h100s(4))
    fast_nccl(monkeypatch)
    found = checks(monkeypatch, count=3)
    assert found["torch.cuda"].status == "FAIL" and "3 of the 4" in found["torch.cuda"].detail


def test_cuda_visible_devices_explains_a_smaller_count(env, monkeypatch):
    install(monkeypatch, h100s(4))
    fast_nccl(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"0,{uuid_of(3)}")
    found = checks(monkeypatch, count=2)
    assert found["torch.cuda"].status == "OK", found["torch.cuda"]
    assert found["gpus"].data["uuids"] == [uuid_of(0), uuid_of(3)]


def test_torch_sees_more_gpus_than_nvml_warns(env, monkeypatch):
    install(monkeypatch, h100s(1))
    fast_nccl(monkeypatch)
    assert checks(monkeypatch, count=2)["torch.cuda"].status == "WARN"


def test_a_gpu_that_cannot_compute_fails(env, monkeypatch):
    install(monkeypatch, h100s(1))
    found = checks(monkeypatch, count=1, probe="GPU 0: CUDA error: uncorrectable ECC error encountered")
    assert found["torch.cuda"].status == "FAIL" and "ECC" in found["torch.cuda"].detail


# ---- /dev/shm: the launcher's rule (decide.shm_warning, 1 GiB, only with dataloader workers) -------------------------


@pytest.mark.parametrize(
    ("size_mib", "workers", "status"),
    [(64, 2, "WARN"), (64, 0, "OK"), (768, 2, "WARN"), (1024, 8, "OK"), (16384, 2, "OK"), (None, 2, "WARN")],
)
def test_shm(size_mib, workers, status):
    found = machine.check_shm(None if size_mib is None else size_mib * 2**20, workers)
    assert found.status == status
    if status == "WARN":
        assert "--ipc=host" in found.detail and f"dataloader_num_workers={workers}" in found.detail


def test_small_shm_reaches_the_row_and_not_twice(env, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setattr(resources, "shm_size", lambda path="/dev/shm": 64 * 2**20)
    found = checks(["--dataloader_num_workers", "2"])
    assert found["/dev/shm"].status == "WARN" and "only 64 MiB" in found["/dev/shm"].detail
    assert found["/dev/shm"].detail in found["processes"].data["warnings"]
    assert found["processes"].status == "OK"


# ---- the plan --------------------------------------------------------------------------------------------------------


def test_processes_row_is_the_plan(env, monkeypatch):
    install(monkeypatch, h100s(8))
    fast_nccl(monkeypatch)
    found = checks(monkeypatch, ["--global_batch_size", "512"], count=8)["processes"]
    assert found.status == "OK"
    assert found.data["nproc_per_node"] == 8 and found.data["backend"] == "nccl"
    assert found.data["precision"] == "bf16 + tf32"
    assert found.data["batch"] == "batch: 32 per device x 8 GPUs x 1 node x 2 accumulation = 512 global"
    assert found.data["cuda_visible_devices"].split(",") == [uuid_of(i) for i in range(8)]
    assert "8 per node (auto: the visible GPUs)" in found.detail


def test_the_sharding_row_says_what_the_ranks_will_choose(env, monkeypatch):
    install(monkeypatch, h100s(8))
    fast_nccl(monkeypatch)
    argv = ["--sharding", "auto", "--model_name_or_path", "scratch:bert", "--config_overrides",
            "num_hidden_layers=32,hidden_size=4096,num_attention_heads=32,intermediate_size=16384"]  # fmt: skip
    found = checks(monkeypatch, argv, count=8)["sharding"]
    assert found.status == "OK" and found.data["mode"] == "fsdp"
    assert (
        found.detail.startswith("fsdp (auto: more than 85% of the smallest GPU's") and "DDP needs about" in found.detail
    )


def test_nproc_per_node_limits_the_all_reduce(env, monkeypatch):
    install(monkeypatch, h100s(4))
    calls = fast_nccl(monkeypatch)
    found = checks(monkeypatch, ["--nproc_per_node", "2"], count=4)
    assert found["processes"].data["nproc_per_node"] == 2 and "--nproc_per_node" in found["processes"].detail
    assert calls == [2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--global_batch_size", "100"], "not a multiple of 32 per device"),
        (["--nproc_per_node", "3"], "only 2 GPU(s) are visible"),
    ],
)
def test_what_the_launcher_refuses_is_a_plan_fail(env, monkeypatch, argv, message):
    install(monkeypatch, h100s(2))
    fast_nccl(monkeypatch)
    found = checks(monkeypatch, argv, count=2)
    assert "processes" not in found
    assert found["plan"].status == "FAIL" and message in found["plan"].detail


def test_a_topology_the_launcher_refuses_fails_plan_and_master(env, monkeypatch):
    no_driver(monkeypatch)
    monkeypatch.setenv("NODE_RANK", "1")  # one node, but node rank 1
    found = checks()
    assert found["plan"].status == "FAIL" and "NODE_RANK=1" in found["plan"].detail
    assert found["master"].status == "FAIL" and "NODE_RANK=1" in found["master"].detail


def test_a_plan_warning_no_other_row_shows_makes_processes_warn():
    inventory = Inventory(gpus=[], nvml_error="none here")
    config = launcher_config(["--use_cpu", "false"], {})
    plan = machine.plan_or_refusal(config, inventory, {}, [], None, 16 * GIB)
    shown = [machine.check_gpus(inventory)]
    found = machine.check_processes(plan, shown)
    assert found.status == "WARN" and "--use_cpu=false on a node without GPU" in found.detail
    assert "CPU mode" not in found.detail.split("; ", 1)[1]  # the gpus row already says so
