"""The GPUs this process can really use, read through NVML (nvidia-ml-py), and the driver check.

NVML lists every GPU the container was given and ignores ``CUDA_VISIBLE_DEVICES``; CUDA honours it. So the
inventory applies, in this order, what the CUDA runtime would:

1. NVML's devices in NVML order (PCI bus order: the launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA's
   ordinals agree). A GPU in MIG mode is replaced by its MIG instances; a device NVML may not open is skipped.
2. ``NVIDIA_VISIBLE_DEVICES`` (read by the container runtime): ``none``/``void``/empty mean no GPU; a list of
   ``GPU-``/``MIG-`` UUIDs (what the Kubernetes device plugin sets) keeps those devices; plain indices are the
   *host's* numbering, already applied by the runtime (``--gpus '"device=2,3"'`` shows NVML two GPUs numbered 0
   and 1), so they are not applied again; ``all`` or a path (the plugin's volume-mounts strategy) keeps all.
3. ``CUDA_VISIBLE_DEVICES``: unset keeps all; empty keeps none; otherwise comma-separated indices, ``GPU-<uuid>``
   or ``MIG-<uuid>`` (unique prefixes allowed). Like CUDA, the list stops at the first invalid entry (``-1``, an
   index out of range, an unknown or ambiguous UUID) and a repeated device empties it.
4. CUDA enumerates at most one MIG instance per process, so further MIG instances are dropped.

Every choice that removed a device is kept in ``Inventory.notes`` so ``gpus``, ``plan`` and ``doctor`` can say why.
This module and train/machine/sampler.py are the only NVML readers: :func:`detect` for the launcher and doctor,
the sampler for the per-step utilisation and memory figures in the logs (exactly the devices the launcher chose).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from train.common.errors import EnvironmentProblem


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as a rank will see it (a whole GPU or one MIG instance)."""

    index: int  # NVML index inside this container (nvidia-smi's numbering); a MIG instance carries its parent's
    uuid: str
    name: str
    memory_total_bytes: int
    compute_capability: tuple[int, int]
    mig_mode: bool


@dataclass
class Inventory:
    """What NVML reported, filtered the way CUDA will filter it. ``gpus[i]`` is what a rank sees as ``cuda:i``."""

    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: int | None = None  # e.g. 12040 for CUDA 12.4, as nvmlSystemGetCudaDriverVersion gives it
    nvml_error: str | None = None  # why NVML could not be used: CPU mode
    nvml_device_count: int = 0  # devices NVML listed before any filtering
    notes: list[str] = field(default_factory=list)  # why devices were left out

    @property
    def cpu_reason(self) -> str | None:
        """Why there is no GPU (None when there is one)."""
        if self.gpus:
            return None
        if self.nvml_error:
            return self.nvml_error
        if self.notes:
            return self.notes[-1]
        return "NVML lists no GPU"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for gpu in data["gpus"]:
            gpu["compute_capability"] = "{}.{}".format(*gpu["compute_capability"])
        data["cuda_driver_version"] = format_cuda_version(self.cuda_driver_version)
        data["cpu_reason"] = self.cpu_reason
        return data


def format_cuda_version(version: int | None) -> str | None:
    """12040 -> '12.4' (NVML's encoding: major * 1000 + minor * 10)."""
    if version is None:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def parse_cuda_version(text: str) -> int:
    """'12.8' -> 12080, the encoding NVML uses."""
    major, _, minor = text.partition(".")
    return int(major) * 1000 + int(minor.split(".")[0] or 0) * 10


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_devices(pynvml: Any, count: int, notes: list[str]) -> list[Gpu]:
    """NVML's devices in order, MIG-enabled GPUs replaced by their MIG instances."""
    devices: list[Gpu] = []
    for index in range(count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            name = _text(pynvml.nvmlDeviceGetName(handle))
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        except pynvml.NVMLError as exc:
            # e.g. NoPermission for a GPU the cgroup denies: CUDA cannot open it either.
            notes.append(f"NVML device {index} skipped: {exc}")
            continue
        try:
            mig = int(pynvml.nvmlDeviceGetMigMode(handle)[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError:  # NotSupported: not a MIG-capable GPU
            mig = False
        capability = (int(major), int(minor))
        if not mig:
            devices.append(Gpu(index, uuid, name, memory, capability, False))
            continue
        instances = _mig_instances(pynvml, handle, index, capability)
        if not instances:
            notes.append(f"GPU {index} ({uuid}) is in MIG mode with no MIG instance: not usable")
        devices.extend(instances)
    return devices


def _mig_instances(pynvml: Any, parent: Any, index: int, capability: tuple[int, int]) -> list[Gpu]:
    instances = []
    try:
        slots = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent))
    except pynvml.NVMLError:
        return []
    for slot in range(slots):
        try:
            handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            name = _text(pynvml.nvmlDeviceGetName(handle))
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        except pynvml.NVMLError:  # NotFound: an empty slot
            continue
        instances.append(Gpu(index, uuid, name, memory, capability, True))
    return instances


def _match_uuid(entry: str, devices: Sequence[Gpu]) -> int | None:
    """Position of the one device whose UUID starts with entry (CUDA accepts unique prefixes)."""
    found = [i for i, gpu in enumerate(devices) if gpu.uuid.lower().startswith(entry.lower())]
    return found[0] if len(found) == 1 else None


def _leading_int(entry: str) -> int | None:
    """CUDA parses indices with strtoul: leading digits count ('1gpu' is 1); none or a sign is invalid."""
    digits = ""
    for char in entry:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def apply_nvidia_visible_devices(value: str | None, devices: list[Gpu], notes: list[str]) -> list[Gpu]:
    """NVIDIA_VISIBLE_DEVICES as the container runtime means it (see the module docstring)."""
    if value is None:
        return devices
    stripped = value.strip()
    if stripped.lower() in ("", "none", "void"):
        notes.append(f"NVIDIA_VISIBLE_DEVICES={value!r}: the container was given no GPU")
        return []
    if stripped.lower() == "all" or stripped.startswith("/"):
        return devices
    entries = [e.strip() for e in stripped.split(",") if e.strip()]
    uuids = [e for e in entries if e.upper().startswith(("GPU-", "MIG-"))]
    if not uuids:
        # Host indices: the runtime already exposed exactly these devices, renumbered from 0.
        return devices
    kept = [gpu for gpu in devices if any(gpu.uuid.lower().startswith(u.lower()) for u in uuids)]
    if len(kept) < len(devices):
        notes.append(f"NVIDIA_VISIBLE_DEVICES keeps {len(kept)} of the {len(devices)} devices NVML lists")
    return kept


def apply_cuda_visible_devices(value: str | None, devices: list[Gpu], notes: list[str]) -> list[Gpu]:
    """CUDA_VISIBLE_DEVICES the way the CUDA runtime applies it (see the module docstring)."""
    if value is None:
        return devices
    if not value.strip():
        notes.append("CUDA_VISIBLE_DEVICES is set and empty: no GPU")
        return []
    chosen: list[int] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.upper().startswith(("GPU-", "MIG-")):
            position = _match_uuid(entry, devices)
        else:
            number = _leading_int(entry)
            position = number if number is not None and number < len(devices) else None
        if position is None:
            notes.append(f"CUDA_VISIBLE_DEVICES={value!r}: entry {entry!r} is not a visible device; CUDA stops there")
            break
        if position in chosen:
            notes.append(f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} repeats a device, which makes CUDA see none")
            return []
        chosen.append(position)
    return [devices[i] for i in chosen]


def _one_mig_instance(devices: list[Gpu], notes: list[str]) -> list[Gpu]:
    migs = [gpu for gpu in devices if gpu.mig_mode]
    if len(migs) <= 1:
        return devices
    notes.append(f"{len(migs)} MIG instances visible but CUDA enumerates one per process: using {migs[0].uuid}")
    return [gpu for gpu in devices if not gpu.mig_mode or gpu is migs[0]]


def detect(environ: Mapping[str, str] | None = None) -> Inventory:
    """The inventory of usable GPUs. Never raises: without NVML it is empty and says why (CPU mode)."""
    environ = os.environ if environ is None else environ
    try:
        import pynvml
    except ImportError:
        return Inventory(nvml_error="nvidia-ml-py is not installed")

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return Inventory(nvml_error="no NVIDIA driver in this container (NVML library not found)")
    except pynvml.NVMLError_DriverNotLoaded:
        return Inventory(nvml_error="the NVIDIA driver is not loaded on the host (NVML: Driver Not Loaded)")
    except pynvml.NVMLError as exc:
        return Inventory(nvml_error=f"NVML failed to start ({exc})")
    inventory = Inventory()
    try:
        try:
            inventory.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            inventory.cuda_driver_version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        except pynvml.NVMLError as exc:
            inventory.notes.append(f"driver version unknown: {exc}")
        inventory.nvml_device_count = int(pynvml.nvmlDeviceGetCount())
        devices = _nvml_devices(pynvml, inventory.nvml_device_count, inventory.notes)
    except pynvml.NVMLError as exc:
        inventory.nvml_error = f"NVML failed ({exc})"
        return inventory
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    devices = apply_nvidia_visible_devices(environ.get("NVIDIA_VISIBLE_DEVICES"), devices, inventory.notes)
    devices = apply_cuda_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), devices, inventory.notes)
    inventory.gpus = _one_mig_instance(devices, inventory.notes)
    return inventory


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built for (None on the CPU build)."""
    import torch

    return torch.version.cuda


# Oldest Linux driver for each CUDA major version (NVIDIA's CUDA compatibility documentation), for the fix hint.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def check_driver(inventory: Inventory, torch_cuda: str | None) -> str | None:
    """Raise EnvironmentProblem when torch cannot use the GPUs; return a warning when the driver is older.

    With GPUs visible, a CPU build of torch (``torch_cuda`` None) cannot use them: fatal, rather than planning
    NCCL ranks that crash. CUDA's minor-version compatibility lets a build for 12.8 run on a driver for 12.0 or
    newer (without PTX JIT), so only an older *major* version is fatal; an older minor is a warning naming both.
    """
    if not inventory.gpus:
        return None
    if not torch_cuda:
        raise EnvironmentProblem(
            f"{len(inventory.gpus)} GPU(s) are visible but the installed torch is a CPU build: use the image's CUDA "
            "build of torch (a CPU wheel was installed over it), or set MLM_USE_CPU=true to train on the CPU"
        )
    if inventory.cuda_driver_version is None:
        return None
    needed = parse_cuda_version(torch_cuda)
    have = inventory.cuda_driver_version
    if have >= needed:
        return None
    driver = f"NVIDIA driver {inventory.driver_version or '?'} (CUDA {format_cuda_version(have)})"
    if have // 1000 < needed // 1000:
        minimum = MIN_DRIVER.get(needed // 1000, "one")
        raise EnvironmentProblem(
            f"{driver} is too old for this image's torch, built for CUDA {torch_cuda}: install a driver >= {minimum} "
            f"(CUDA {torch_cuda} or newer) on the host, or use an image built for CUDA {format_cuda_version(have)}"
        )
    return (
        f"{driver} is older than torch's CUDA {torch_cuda}: running through CUDA minor-version compatibility "
        f"(no PTX JIT); upgrade the driver if kernels fail to load"
    )
