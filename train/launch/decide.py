"""The launch decisions, as pure functions of the resolved options, the GPU inventory and the topology: processes
per node, the log format, use_cpu, the process-group backend, precision, the global batch and its gradient
accumulation, the padding multiple, the /dev/shm threshold, torchrun's restarts. ``plan`` calls them for a launch,
``doctor`` for its rows: one rule each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from train.common.errors import ConfigError, EnvironmentProblem
from train.common.handoff import global_batch, precision_label, precision_name
from train.config import MAX_PROCESSES, shown
from train.launch.topology import Topology

# DataLoader workers hand batches to their rank through /dev/shm; below this, Docker's 64 MB default among them,
# they die with "bus error".
MIN_SHM_BYTES = 2**30


def decide_nproc(
    requested: str | None, requested_source: str, pet_value: str | None, gpu_count: int, cpu_count: int
) -> tuple[int, str]:
    """Processes on this node and where the number came from. ``gpu_count`` is 0 in CPU mode."""
    if requested is not None:
        value, source = requested, requested_source
    elif pet_value is not None:
        value, source = pet_value, "PET_NPROC_PER_NODE"
    else:
        value, source = "auto", "auto"
    value = value.strip().lower()
    if value in ("auto", "gpu"):
        if gpu_count:
            return gpu_count, f"{source}: the visible GPUs" if source != "auto" else "auto: the visible GPUs"
        if value == "gpu":
            raise EnvironmentProblem(f"{source}=gpu but no GPU is visible")
        # One process per node on CPU: it uses every core, where N gloo ranks would split them and add traffic.
        return 1, f"{source}: one process on CPU" if source != "auto" else "auto: one process on CPU"
    if value == "cpu":
        return cpu_count, f"{source}=cpu: one process per CPU core (torchrun's meaning)"
    # Bounded as MLM_NPROC_PER_NODE is (train.config), whichever variable gave it: torchrun would otherwise be
    # asked for thousands of processes. isdecimal + isascii: int() refuses a superscript digit isdigit() accepts.
    if not (value.isdecimal() and value.isascii()) or not 1 <= int(value) <= MAX_PROCESSES:
        raise ConfigError(
            f"{source}={shown(value)}: expected a positive integer up to {MAX_PROCESSES}, auto, gpu or cpu"
        )
    count = int(value)
    if gpu_count and count > gpu_count:
        raise ConfigError(
            f"{source}={count}: only {gpu_count} GPU(s) are visible; a rank per GPU means at most {gpu_count}"
        )
    return count, source


def decide_log_format(configured: str, terminal: str) -> tuple[str, ...]:
    """The decision flags for ``log_format``: ``auto`` is resolved once, on the launcher's terminal (``terminal``,
    json or text), since a rank's stdout is a pipe whenever torchrun filters output."""
    return ("--log_format", terminal) if configured == "auto" else ()


def decide_use_cpu(use_cpu: bool, source: str | None, cpu_mode: bool) -> tuple[tuple[str, ...], str | None]:
    """The decision flags for ``use_cpu`` in CPU mode, or the warning when the user turned it off there.

    accelerate wraps CPU ranks in DDP only with use_cpu: without it every rank trains its own copy of the model on
    its shard and gradients are never averaged (transformers 5.25 / accelerate 1.16)."""
    if not cpu_mode or use_cpu:
        return (), None
    if source is not None:
        return (), (
            f"{source}=false on a node without GPU: CPU ranks get a process group but no DDP, so each would train "
            "its own copy; remove it"
        )
    return ("--use_cpu", "true"), None


def decide_backend(configured: str | None, cpu_mode: bool) -> tuple[str, tuple[str, ...]]:
    """The process-group backend and its decision flags: the user's (``configured``: set and not empty), else gloo
    on CPU and nccl on GPUs."""
    if configured:
        return configured, ()
    backend = "gloo" if cpu_mode else "nccl"
    return backend, ("--ddp_backend", backend)


@dataclass(frozen=True)
class Precision:
    name: str  # bf16 | fp16 | fp32
    tf32: bool
    flags: tuple[str, ...]  # decision flags for the ranks (empty when the user chose)
    source: str

    @property
    def label(self) -> str:
        return precision_label(self.name, self.tf32)


def decide_precision(
    fp16: bool, bf16: bool, tf32: bool | None, user_set: Mapping[str, str], capability: tuple[int, int] | None
) -> Precision:
    """bf16 + tf32 on compute capability >= 8.0, fp16 on 7.x, fp32 on CPU; a user's choice is checked, not changed.

    ``user_set`` maps the precision fields the user set (fp16, bf16, tf32) to where they set them;
    ``capability`` is the lowest compute capability of the GPUs used, None on CPU.
    """
    device = "the CPU" if capability is None else "compute capability {}.{}".format(*capability)
    ampere = capability is not None and capability >= (8, 0)
    if bf16 and "bf16" in user_set and capability is not None and not ampere:
        raise ConfigError(f"{user_set['bf16']}: bf16 needs compute capability 8.0 or newer, not {device}; use fp16")
    if fp16 and "fp16" in user_set and capability is None:
        raise ConfigError(f"{user_set['fp16']}: fp16 needs a GPU and this node has none; use fp32 (or bf16 on CPU)")
    if tf32 and "tf32" in user_set and not ampere:
        raise ConfigError(f"{user_set['tf32']}: tf32 needs compute capability 8.0 or newer, not {device}")

    flags: list[str] = []
    if "fp16" in user_set or "bf16" in user_set:
        name = precision_name(fp16, bf16)
        source = ", ".join(user_set[key] for key in ("bf16", "fp16") if key in user_set)
    elif ampere:
        name, source = "bf16", f"auto: {device}"
        flags += ["--bf16", "true"]
    elif capability is not None and capability >= (7, 0):
        name, source = "fp16", f"auto: {device}"
        flags += ["--fp16", "true"]
    else:
        name, source = "fp32", f"auto: {device}"
    use_tf32 = bool(tf32) if "tf32" in user_set else ampere
    if use_tf32 and "tf32" not in user_set:
        flags += ["--tf32", "true"]
    return Precision(name, use_tf32, tuple(flags), source)


@dataclass(frozen=True)
class Batch:
    per_device: int
    processes: int
    min_nodes: int
    max_nodes: int
    accumulation: int
    global_batch_size: int | None  # None when the node count is elastic
    flags: tuple[str, ...]
    unit: str  # "GPU" or "process"

    @property
    def banner(self) -> str:
        nodes = str(self.max_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}-{self.max_nodes}"
        total = (
            str(self.global_batch_size)
            if self.global_batch_size is not None
            else "-".join(
                str(global_batch(self.per_device, self.processes * n, self.accumulation))
                for n in (self.min_nodes, self.max_nodes)
            )
        )
        return (
            f"batch: {self.per_device} per device x {plural(self.processes, self.unit)} x "
            f"{nodes} node{'s' if self.max_nodes > 1 else ''} x {self.accumulation} accumulation = {total} global"
        )


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'es' if word.endswith('s') and count != 1 else 's' if count != 1 else ''}"


@dataclass(frozen=True)
class BatchOptions:
    """The batch as the options set it, with where: per device, the gradient accumulation and the global batch."""

    per_device: int
    accumulation: int
    accumulation_source: str | None  # where the user set the accumulation; None when they did not
    global_batch_size: int | None  # None: not set (the accumulation stands)
    global_source: str  # the global batch's option as the user would name it


def decide_batch(options: BatchOptions, processes: int, topology: Topology, unit: str) -> Batch:
    """Derive gradient accumulation from the global batch (samples per optimizer step across all ranks) for
    ``processes`` per node of ``unit`` (GPU or process)."""
    per_device, accumulation, global_batch_size = options.per_device, options.accumulation, options.global_batch_size
    accumulation_source, global_source = options.accumulation_source, options.global_source
    flags: tuple[str, ...] = ()
    if global_batch_size is None:
        total = None if topology.elastic else global_batch(per_device, processes * topology.max_nodes, accumulation)
        return Batch(per_device, processes, topology.min_nodes, topology.max_nodes, accumulation, total, flags, unit)
    if topology.elastic:
        raise ConfigError(
            f"{global_source}={global_batch_size}: the node count is elastic ({topology.nnodes}), so the world size "
            "and the accumulation it implies are unknown until rendezvous; set gradient_accumulation_steps instead"
        )
    world = processes * topology.max_nodes
    step = per_device * world
    if global_batch_size % step:
        lower, higher = (global_batch_size // step) * step, (global_batch_size // step + 1) * step
        either = " or ".join(str(n) for n in (lower, higher) if n > 0)
        hint = (
            f"; or per_device_train_batch_size={global_batch_size // world}" if global_batch_size % world == 0 else ""
        )
        raise ConfigError(
            f"{global_source}={global_batch_size}: not a multiple of {per_device} per device x "
            f"{plural(processes, unit)} x {plural(topology.max_nodes, 'node')} = {step}; use {either}{hint}"
        )
    derived = global_batch_size // step
    if accumulation_source and accumulation != derived:
        raise ConfigError(
            f"{accumulation_source}={accumulation} contradicts {global_source}={global_batch_size}, which needs "
            f"{derived} on {plural(world, unit)} at {per_device} per device; set only one of them"
        )
    if not accumulation_source:
        flags = ("--gradient_accumulation_steps", str(derived))
    return Batch(per_device, processes, topology.min_nodes, topology.max_nodes, derived, global_batch_size, flags, unit)


def decide_pad_multiple(configured: int, source: str | None, cpu_mode: bool) -> tuple[str, ...]:
    """The decision flags for ``pad_to_multiple_of``: dynamic padding rounds each batch's length up to a multiple
    of 8 for the GPU's tensor cores. A CPU has none, so there the rounding only adds positions to compute (8.7 %
    more on the real-text benchmark's batches of 32; the mid model's dense-head step was 6-7 % slower than
    run_mlm.py's, which pads to the longest): CPU ranks pad to the longest sample unless the user chose.

    This is the value, a fact of the hardware, decided whatever the padding mode: whether a mode uses it is the
    mode's rule (train/data/padding.py ``Padding.pad_multiple``), applied where the collator is built."""
    if cpu_mode and source is None and configured != 1:
        return ("--pad_to_multiple_of", "1")
    return ()


def decide_max_restarts(configured: int, user_set: bool, topology: Topology) -> int:
    """torchrun's restarts: the user's option when set, else the cluster's (PET_MAX_RESTARTS), else the default."""
    if user_set or topology.max_restarts is None:
        return configured
    return topology.max_restarts


def shm_warning(shm_bytes: int | None, workers: int) -> str | None:
    """DataLoader workers hand batches over through /dev/shm; Docker's default 64 MB makes them die."""
    if workers <= 0 or (shm_bytes is not None and shm_bytes >= MIN_SHM_BYTES):
        return None
    size = "missing" if shm_bytes is None else f"only {shm_bytes / 2**20:.0f} MiB"
    return (
        f"/dev/shm is {size} and dataloader_num_workers={workers}: workers can die with 'bus error'. Fix: "
        "docker run --ipc=host (or --shm-size=2g); on Kubernetes mount an emptyDir with medium: Memory at /dev/shm; "
        "or set MLM_DATALOADER_NUM_WORKERS=0"
    )
