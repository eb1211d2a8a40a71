"""The one NVML fake every test uses, at the pynvml function boundary: the devices, MIG instances, driver and
per-device utilisation that ``train.machine.gpus`` (the only NVML reader) asks for. The rest of NVML is left real."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest


def uuid_of(n: int) -> str:
    return f"GPU-{n:08x}-1111-2222-3333-44445555{n:04x}"


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory: int = 80 * 2**30
    cc: tuple[int, int] = (9, 0)
    mig: int | None = None  # None: MIG not supported; 0/1: current mode
    mig_instances: list[tuple[str, str, int]] = field(default_factory=list)
    error: type[pynvml.NVMLError] | None = None  # raised by nvmlDeviceGetHandleByIndex
    util_pct: int = 90
    memory_used: int = 10 * 2**30


@dataclass
class FakeNvml:
    devices: list[FakeDevice]
    driver: str = "550.54.15"
    cuda: int = 12040
    shutdowns: int = 0


def install(
    monkeypatch: pytest.MonkeyPatch, fake: FakeNvml | None = None, init_error: type[pynvml.NVMLError] | None = None
) -> FakeNvml:
    """Replace the pynvml functions train.machine.gpus calls with ones reading ``fake``."""
    fake = fake or FakeNvml([])

    def init():
        if init_error is not None:
            raise init_error()

    def handle_by_index(i):
        device = fake.devices[i]
        if device.error is not None:
            raise device.error()
        return ("gpu", i)

    def handle_by_uuid(uuid):
        for i, device in enumerate(fake.devices):
            if device.uuid == uuid:
                return ("gpu", i)
            for slot, instance in enumerate(device.mig_instances):
                if instance[0] == uuid:
                    return ("mig", i, slot)
        raise pynvml.NVMLError_NotFound()

    def device_of(handle):
        if handle[0] == "mig":
            uuid, name, memory = fake.devices[handle[1]].mig_instances[handle[2]]
            return SimpleNamespace(uuid=uuid, name=name, memory=memory, cc=fake.devices[handle[1]].cc)
        return fake.devices[handle[1]]

    def memory_info(handle):
        device = device_of(handle)
        used = getattr(device, "memory_used", 0)
        return SimpleNamespace(total=device.memory, used=used, free=device.memory - used)

    def utilization(handle):
        if handle[0] == "mig":
            raise pynvml.NVMLError_NotSupported()
        return SimpleNamespace(gpu=device_of(handle).util_pct, memory=0)

    def mig_mode(handle):
        device = fake.devices[handle[1]]
        if device.mig is None:
            raise pynvml.NVMLError_NotSupported()
        return [device.mig, device.mig]

    def mig_handle(handle, slot):
        device = fake.devices[handle[1]]
        if slot >= len(device.mig_instances):
            raise pynvml.NVMLError_NotFound()
        return ("mig", handle[1], slot)

    def shutdown():
        fake.shutdowns += 1

    patches = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(fake.devices),
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetHandleByUUID": handle_by_uuid,
        "nvmlDeviceGetUUID": lambda h: device_of(h).uuid,
        "nvmlDeviceGetName": lambda h: device_of(h).name,
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetCudaComputeCapability": lambda h: device_of(h).cc,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlSystemGetDriverVersion": lambda: fake.driver,
        "nvmlSystemGetCudaDriverVersion": lambda: fake.cuda,
        "nvmlSystemGetCudaDriverVersion_v2": lambda: fake.cuda,
    }
    for name, function in patches.items():
        monkeypatch.setattr(pynvml, name, function)
    return fake


def no_driver(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """A machine without the NVIDIA driver: NVML's library is missing."""
    return install(monkeypatch, init_error=pynvml.NVMLError_LibraryNotFound)


def h100s(n: int) -> FakeNvml:
    return FakeNvml([FakeDevice(uuid_of(i)) for i in range(n)])


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return no_driver(monkeypatch)
