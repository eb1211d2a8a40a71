"""GPU detection against a fake NVML, faked only at the pynvml function boundary."""

from __future__ import annotations

import json

import pynvml
import pytest

from tests.fakes import FakeDevice, FakeNvml, h100s, install, uuid_of
from train.common.errors import EnvironmentProblem
from train.machine import __main__ as cli
from train.machine import gpus
from train.machine.sampler import Sampler


def indices(inventory: gpus.Inventory) -> list[int]:
    return [gpu.index for gpu in inventory.gpus]


def test_eight_gpus_all_visible(monkeypatch):
    fake = install(monkeypatch, h100s(8))
    inventory = gpus.detect({})
    assert indices(inventory) == list(range(8))
    first = inventory.gpus[0]
    assert first == gpus.Gpu(0, uuid_of(0), "NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0), False)
    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_driver_version == 12040
    assert inventory.nvml_error is None and inventory.cpu_reason is None
    assert inventory.nvml_device_count == 8
    assert fake.shutdowns == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0,2,4", [0, 2, 4]),
        ("4,0", [4, 0]),  # order is CUDA's order
        (" 1 , 3 ", [1, 3]),
        ("1gpu", [1]),  # CUDA reads indices like strtoul
        ("1,bogus,2", [1]),  # stops at the first invalid entry
        ("2,9,3", [2]),  # an index past the last device is invalid
        ("0,-1,1", [0]),
        ("-1", []),
        ("", []),
        ("3,1,3", []),  # a repeated device makes CUDA see none
    ],
)
def test_cuda_visible_devices_indices(monkeypatch, value, expected):
    install(monkeypatch, h100s(8))
    inventory = gpus.detect({"CUDA_VISIBLE_DEVICES": value})
    assert indices(inventory) == expected
    if not expected:
        assert "CUDA_VISIBLE_DEVICES" in inventory.cpu_reason


def test_cuda_visible_devices_uuids_and_prefixes(monkeypatch):
    install(monkeypatch, h100s(4))
    full, prefix = uuid_of(3), uuid_of(1)[:12]
    assert indices(gpus.detect({"CUDA_VISIBLE_DEVICES": f"{full},{prefix}"})) == [3, 1]
    # "GPU-0000" is a prefix of every UUID: ambiguous, so invalid, so CUDA stops before it.
    assert indices(gpus.detect({"CUDA_VISIBLE_DEVICES": "GPU-00000002,GPU-0000"})) == [2]
    assert indices(gpus.detect({"CUDA_VISIBLE_DEVICES": "GPU-ffffffff"})) == []


def a100_with_mig(instances: int) -> FakeNvml:
    parent = FakeDevice(
        "GPU-a100a100-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB",
        memory=40 * 2**30,
        cc=(8, 0),
        mig=1,
        mig_instances=[
            (f"MIG-{i}a7c0000-0000-0000-0000-00000000000{i}", "A100 MIG 1g.5gb", 5 * 2**30) for i in range(instances)
        ],
    )
    return FakeNvml([parent, FakeDevice(uuid_of(1), mig=0)])


def test_mig_instances_replace_their_parent_and_cuda_sees_one(monkeypatch):
    install(monkeypatch, a100_with_mig(3))
    inventory = gpus.detect({})
    # One MIG instance per process (CUDA's limit) plus the non-MIG GPU.
    assert [(g.uuid[:5], g.mig_mode, g.index) for g in inventory.gpus] == [("MIG-0", True, 0), ("GPU-0", False, 1)]
    assert inventory.gpus[0].compute_capability == (8, 0)
    assert inventory.gpus[0].memory_total_bytes == 5 * 2**30
    assert any("one per process" in note for note in inventory.notes)


def test_mig_uuid_selects_that_instance(monkeypatch):
    install(monkeypatch, a100_with_mig(3))
    second = "MIG-1a7c0000-0000-0000-0000-000000000001"
    for variable in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        inventory = gpus.detect({variable: second})
        assert [g.uuid for g in inventory.gpus] == [second], variable


def test_mig_mode_without_instances_is_not_usable(monkeypatch):
    install(monkeypatch, a100_with_mig(0))
    inventory = gpus.detect({})
    assert indices(inventory) == [1]
    assert any("MIG mode with no MIG instance" in note for note in inventory.notes)


@pytest.mark.parametrize("value", ["none", "void", "NONE", ""])
def test_nvidia_visible_devices_none(monkeypatch, value):
    install(monkeypatch, h100s(2))
    inventory = gpus.detect({"NVIDIA_VISIBLE_DEVICES": value})
    assert inventory.gpus == []
    assert "NVIDIA_VISIBLE_DEVICES" in inventory.cpu_reason


def test_nvidia_visible_devices_host_indices_are_not_applied_again(monkeypatch):
    # docker run --gpus '"device=2,3"': NVML inside sees two GPUs numbered 0 and 1; both are used.
    install(monkeypatch, h100s(2))
    inventory = gpus.detect({"NVIDIA_VISIBLE_DEVICES": "2,3"})
    assert indices(inventory) == [0, 1]
    assert inventory.notes == []


@pytest.mark.parametrize("value", ["all", "/var/run/nvidia-container-devices"])
def test_nvidia_visible_devices_all_or_volume_mounts(monkeypatch, value):
    install(monkeypatch, h100s(3))
    assert indices(gpus.detect({"NVIDIA_VISIBLE_DEVICES": value})) == [0, 1, 2]


def test_nvidia_visible_devices_uuid_filters_then_cuda_indices_count_from_there(monkeypatch):
    install(monkeypatch, h100s(4))
    env = {"NVIDIA_VISIBLE_DEVICES": f"{uuid_of(1)},{uuid_of(3)}"}
    assert indices(gpus.detect(env)) == [1, 3]
    assert indices(gpus.detect({**env, "CUDA_VISIBLE_DEVICES": "1"})) == [3]


def test_nvml_missing_is_cpu_mode(monkeypatch):
    install(monkeypatch, init_error=pynvml.NVMLError_LibraryNotFound)
    inventory = gpus.detect({})
    assert inventory.gpus == []
    assert "no NVIDIA driver" in inventory.nvml_error
    assert inventory.cpu_reason == inventory.nvml_error


def test_other_nvml_errors_are_cpu_mode(monkeypatch):
    install(monkeypatch, init_error=pynvml.NVMLError_DriverNotLoaded)
    assert "not loaded" in gpus.detect({}).cpu_reason
    install(monkeypatch, init_error=pynvml.NVMLError_Unknown)
    assert "Unknown Error" in gpus.detect({}).cpu_reason


def test_device_nvml_may_not_open_is_skipped(monkeypatch):
    fake = h100s(3)
    fake.devices[1].error = pynvml.NVMLError_NoPermission
    install(monkeypatch, fake)
    inventory = gpus.detect({})
    assert indices(inventory) == [0, 2]
    assert any("device 1 skipped" in note for note in inventory.notes)


def test_driver_too_old_names_both_versions(monkeypatch):
    fake = h100s(1)
    fake.cuda, fake.driver = 11080, "520.61.05"
    install(monkeypatch, fake)
    inventory = gpus.detect({})
    with pytest.raises(EnvironmentProblem, match=r"520\.61\.05 \(CUDA 11\.8\).*CUDA 12\.8") as caught:
        gpus.check_driver(inventory, "12.8")
    assert caught.value.exit_code == 3


def test_driver_older_minor_is_a_warning(monkeypatch):
    install(monkeypatch, h100s(1))  # CUDA 12.4 driver
    inventory = gpus.detect({})
    warning = gpus.check_driver(inventory, "12.8")
    assert "CUDA 12.4" in warning and "12.8" in warning
    assert gpus.check_driver(inventory, "12.4") is None
    with pytest.raises(EnvironmentProblem, match="CPU build"):  # GPUs that a CPU build of torch cannot use
        gpus.check_driver(inventory, None)


def test_no_driver_check_without_gpu(monkeypatch):
    fake = h100s(1)
    fake.cuda = 11000
    install(monkeypatch, fake)
    assert gpus.check_driver(gpus.detect({"CUDA_VISIBLE_DEVICES": ""}), "12.8") is None


def test_gpus_command_prints_a_table(monkeypatch, capsys):
    install(monkeypatch, h100s(2))
    monkeypatch.setattr(cli, "torch_cuda_version", lambda: "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert cli.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["cuda", "nvml", "name", "memory", "cc", "mig", "uuid"]
    assert lines[1].split()[:2] == ["0", "1"] and uuid_of(1) in lines[1] and "80.0 GiB" in lines[1]
    assert "driver 550.54.15, CUDA 12.4" in lines[2]


def test_gpus_command_cpu_mode_and_json(monkeypatch, capsys):
    install(monkeypatch, init_error=pynvml.NVMLError_LibraryNotFound)
    monkeypatch.setattr(cli, "torch_cuda_version", lambda: None)
    assert cli.main([]) == 0
    assert capsys.readouterr().out.startswith("no GPU visible: CPU mode (no NVIDIA driver")
    assert cli.main(["--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["gpus"] == [] and "no NVIDIA driver" in document["cpu_reason"]


def test_gpus_command_exits_3_on_old_driver(monkeypatch, capsys):
    fake = h100s(1)
    fake.cuda = 11080
    install(monkeypatch, fake)
    monkeypatch.setattr(cli, "torch_cuda_version", lambda: "12.8")
    monkeypatch.delenv("MLM_DEBUG", raising=False)
    from train.common.errors import run_main

    assert run_main(cli.main, []) == 3
    assert "too old" in capsys.readouterr().err


# ---- the sampler the logs use -------------------------------------------------------------------------------------


def test_sampler_reads_the_devices_it_was_handed_by_uuid(monkeypatch):
    fake = h100s(4)
    fake.devices[2].util_pct, fake.devices[2].memory_used = 97, 30 * 2**30
    install(monkeypatch, fake)
    sampler = Sampler([uuid_of(2), uuid_of(0), "GPU-gone"])
    sampler.start()
    found = sampler.sample()
    sampler.stop()
    # index is the CUDA ordinal in the rank (the order handed over); a UUID NVML no longer knows is left out
    assert found == [
        {"index": 0, "util_pct": 97, "mem_used_mib": 30720, "mem_total_mib": 81920},
        {"index": 1, "util_pct": 90, "mem_used_mib": 10240, "mem_total_mib": 81920},
    ]
    assert fake.shutdowns == 1


def test_sampler_without_nvml_or_devices_is_silent(monkeypatch):
    install(monkeypatch, init_error=pynvml.NVMLError_LibraryNotFound)
    for uuids in ([uuid_of(0)], []):
        sampler = Sampler(uuids)
        sampler.start()
        assert sampler.sample() == []
        sampler.stop()
