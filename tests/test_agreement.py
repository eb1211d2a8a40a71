"""doctor, plan and a real run agree on every decision for the same environment.

The same fake NVML, the same environment and the same /dev/shm go to doctor's ``run_checks`` and to
``python -m train.launch plan`` (in-process, the launcher's own ``main``): the GPUs doctor reports are the plan's,
its processes are the plan's ``nproc_per_node``, it warns about /dev/shm exactly when the plan does, and the
rendezvous address it checks is the one the plan hands torchrun.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

import train.launch.__main__ as launch_main
from tests.doctor.helpers import checks, fast_nccl
from tests.fakes import FakeDevice, FakeNvml, h100s, install, uuid_of
from train.common.errors import run_main
from train.doctor import machine

GIB = 2**30
TORCH_CUDA = "12.4"
MIG = [(f"MIG-{n:04x}-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * GIB) for n in (1, 2)]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shm_of(size: int):
    """os.statvfs with /dev/shm of ``size`` bytes (resources.shm_size reads it for both); other paths stay real."""
    real = os.statvfs

    def statvfs(path):
        if str(path) != "/dev/shm":
            return real(path)
        stats = real(Path.cwd())
        return os.statvfs_result((4096, 4096, size // 4096, size // 4096, size // 4096, *tuple(stats)[5:]))

    return statvfs


# scenario: (the machine, the environment on top of the base one, the GPUs the rules must leave)
SCENARIOS = {
    "hidden GPUs (NVIDIA_VISIBLE_DEVICES)": (
        h100s(4),
        {"NVIDIA_VISIBLE_DEVICES": f"{uuid_of(1)},{uuid_of(3)}"},
        [uuid_of(1), uuid_of(3)],
    ),
    "a MIG-enabled GPU with instances": (
        FakeNvml([FakeDevice(uuid_of(0), mig=1, mig_instances=MIG), FakeDevice(uuid_of(1))]),
        {},
        [MIG[0][0], uuid_of(1)],  # CUDA enumerates one MIG instance per process
    ),
    "an invalid CUDA_VISIBLE_DEVICES entry in the middle": (
        h100s(4),
        {"CUDA_VISIBLE_DEVICES": "0,bogus,2"},
        [uuid_of(0)],  # CUDA stops at the first invalid entry
    ),
    "a small /dev/shm with dataloader workers": (
        h100s(2),
        {"MLM_DATALOADER_NUM_WORKERS": "2", "SHM_MIB": "64"},
        [uuid_of(0), uuid_of(1)],
    ),
    "a small /dev/shm without dataloader workers": (
        h100s(2),
        {"MLM_DATALOADER_NUM_WORKERS": "0", "SHM_MIB": "64"},
        [uuid_of(0), uuid_of(1)],
    ),
    "PET_MASTER_ADDR and MASTER_ADDR both set": (
        h100s(2),
        {
            "PET_NNODES": "2",
            "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": "CLOSED",
            "MASTER_ADDR": "mlm-master-0.invalid",
            "MASTER_PORT": "23456",
        },
        [uuid_of(0), uuid_of(1)],
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_doctor_and_plan_agree(scenario, tmp_path, monkeypatch, capsys):
    fake, extra, expected = SCENARIOS[scenario]
    install(monkeypatch, fake)
    fast_nccl(monkeypatch)
    extra = {k: (str(closed_port()) if v == "CLOSED" else v) for k, v in extra.items()}
    shm = int(extra.pop("SHM_MIB", "16384")) * 2**20
    monkeypatch.setattr(os, "statvfs", shm_of(shm))
    environ = {
        "MLM_MODEL_NAME_OR_PATH": "scratch:distilbert",
        "MLM_DATASET": "demo",
        "MLM_OUTPUT_DIR": str(tmp_path / "out"),
        "MLM_LOG_FORMAT": "text",
        "HF_HOME": os.environ["HF_HOME"],
        "HF_HUB_OFFLINE": "1",
        **extra,
    }

    # The launcher's plan, as `python -m train.launch plan` prints it.
    monkeypatch.setattr(launch_main, "torch_cuda_version", lambda: TORCH_CUDA)
    code = run_main(lambda argv: launch_main.main(argv, environ), ["plan"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    assert plan["recipe"].startswith("modern (auto: trained from scratch): learning rate 0.001"), plan["recipe"]

    # doctor, on the same machine and environment (torch faked after the config is loaded, as TrainingArguments
    # acts on torch.cuda when built).
    monkeypatch.setattr(machine, "torch_cuda_version", lambda: TORCH_CUDA)
    visible = len(plan["gpus"])
    rows = checks(monkeypatch, environ=environ, cuda=TORCH_CUDA, count=visible)

    # The GPUs: the same list, and the one the rules must leave.
    assert rows["gpus"].data["uuids"] == [gpu["uuid"] for gpu in plan["gpus"]] == expected
    assert rows["torch.cuda"].status == "OK"
    # The processes, and every other decision the plan row reports.
    processes = rows["processes"]
    assert processes.data["nproc_per_node"] == plan["nproc_per_node"]
    assert processes.data["nproc_source"] == plan["nproc_per_node_source"]
    assert processes.data["backend"] == plan["backend"]
    assert processes.data["batch"] == plan["batch"]
    assert processes.data["cuda_visible_devices"] == plan["env"]["CUDA_VISIBLE_DEVICES"]
    assert processes.data["warnings"] == plan["warnings"]
    # /dev/shm: WARN exactly when the plan carries the warning, with the same words.
    shm_warnings = [w for w in plan["warnings"] if w.startswith("/dev/shm")]
    assert (rows["/dev/shm"].status == "WARN") == bool(shm_warnings)
    if shm_warnings:
        assert [rows["/dev/shm"].detail] == shm_warnings
    # The rendezvous.
    rendezvous = plan["rendezvous"]
    if rendezvous["mode"] == "standalone":
        assert rows["master"].status == "SKIP"
    else:
        master = rows["master"]
        assert (master.data["host"], master.data["port"]) == (rendezvous["master_addr"], rendezvous["master_port"])
        assert master.status == "FAIL"  # nothing listens on the closed port
        assert f"PET_MASTER_ADDR={rendezvous['master_addr']}" in master.detail
        assert plan["topology_sources"]["master_addr"] == "PET_MASTER_ADDR"
