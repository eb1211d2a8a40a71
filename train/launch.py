"""The launcher: decide the topology, precision and batch once, then run torchrun and translate its exit.

    python -m train.launch train [option flags]   # run torchrun as a child, exit with the documented code
    python -m train.launch plan  [option flags]   # print the decisions as one JSON document, exit 0

Decisions are pure functions of (config, GPU inventory, cluster environment) so each is tested on its own. They
reach the ranks as extra option flags appended after the user's (highest precedence) and as a few environment
variables; a rank never re-detects GPUs or re-derives the topology.

The cluster environment, each variable preferred over the next:

    nnodes          PET_NNODES (N, or min:max for elastic)  > NNODES  > 1
    node rank       PET_NODE_RANK  > NODE_RANK  > JOB_COMPLETION_INDEX (Indexed Job, multi-node only)  > 0
    master          PET_MASTER_ADDR/PET_MASTER_PORT  > MASTER_ADDR/MASTER_PORT  (port default 29500)
    rendezvous      PET_RDZV_ENDPOINT, PET_RDZV_BACKEND (default c10d), PET_RDZV_ID, PET_RDZV_CONF
    nproc_per_node  MLM_NPROC_PER_NODE  > PET_NPROC_PER_NODE  > auto (visible GPUs, 1 on CPU)
    max_restarts    MLM_MAX_RESTARTS  > PET_MAX_RESTARTS  > 0

torchrun would also read any PET_* variable behind our back, so they are removed from its environment: the
``command`` in ``plan`` is exactly what runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from train.config import load_config
from train.errors import (
    EXIT_CONFIG,
    EXIT_DIR_ENV,
    EXIT_ENVIRONMENT,
    EXIT_PREEMPTED,
    ConfigError,
    EnvironmentProblem,
    UserError,
    documented_exit,
    read_exit_codes,
    run_main,
)
from train.gpus import Inventory, check_driver, detect, torch_cuda_version
from train.outputs import check_output_dir

JOB_MODULE = "train.job"
DEFAULT_MASTER_PORT = 29500
DEFAULT_RDZV_ID = "mlm-trainer"
MIN_SHM_BYTES = 2**30
SECRET_FLAGS = ("--hub_token",)
# Variables that make accelerate (inside TrainingArguments) believe this process is a rank. The launcher is not
# one: a PyTorchJob pod carries WORLD_SIZE/RANK for its torchrun, and with them accelerate would start a process
# group in the launcher and wait for peers that never come.
RANK_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


# ---------------------------------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class Topology:
    """Where this node sits in the job, from the cluster environment."""

    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    mode: str = "standalone"  # standalone (one node) | static (fixed nodes, node 0 hosts the store) | dynamic
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    max_restarts: int | None = None  # PET_MAX_RESTARTS
    nproc_per_node: str | None = None  # PET_NPROC_PER_NODE
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def nnodes(self) -> str:
        """As torchrun takes it: N, or min:max when elastic."""
        return str(self.max_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"

    @property
    def elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    @property
    def address_to_wait_for(self) -> tuple[str, str] | None:
        """(host, source) this node must resolve before torchrun can meet the others."""
        if self.mode == "standalone" or (self.mode == "static" and self.node_rank == 0):
            return None  # node 0 of a static rendezvous hosts the store: it only listens
        if self.rdzv_endpoint:
            return _split_endpoint(self.rdzv_endpoint)[0], self.sources.get("rdzv_endpoint", "PET_RDZV_ENDPOINT")
        if self.master_addr:
            return self.master_addr, self.sources.get("master_addr", "MASTER_ADDR")
        return None


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | tuple[None, None]:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value, name
    return None, None


def _int(value: str, source: str, minimum: int = 0) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{source}={value!r}: expected an integer >= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{source}={value!r}: expected an integer >= {minimum}")
    return number


def _split_endpoint(endpoint: str) -> tuple[str, int | None]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        return endpoint.strip("[]"), None
    return host.strip("[]"), int(port)


def _parse_conf(text: str | None) -> dict[str, str]:
    conf = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            conf[key.strip()] = value.strip()
    return conf


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """Read the node topology a PyTorchJob, TrainJob, Indexed Job or a person gave this node."""
    sources: dict[str, str] = {}

    raw, source = _first(environ, "PET_NNODES", "NNODES")
    min_nodes = max_nodes = 1
    if raw is not None:
        sources["nnodes"] = source
        low, sep, high = raw.partition(":")
        min_nodes = _int(low, source, 1)
        max_nodes = _int(high, source, 1) if sep else min_nodes
        if max_nodes < min_nodes:
            raise ConfigError(f"{source}={raw!r}: expected N or min:max with min <= max")

    raw, source = _first(environ, "PET_NODE_RANK", "NODE_RANK")
    if raw is None and max_nodes > 1:
        # A Kubernetes Indexed Job numbers its pods 0..completions-1: that is the node rank.
        raw, source = _first(environ, "JOB_COMPLETION_INDEX")
    node_rank = 0
    if raw is not None:
        node_rank = _int(raw, source)
        sources["node_rank"] = source

    master_addr, source = _first(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
    if source:
        sources["master_addr"] = source
    raw, source = _first(environ, "PET_MASTER_PORT", "MASTER_PORT")
    master_port = DEFAULT_MASTER_PORT
    if raw is not None:
        master_port = _int(raw, source, 1)
        sources["master_port"] = source

    endpoint, source = _first(environ, "PET_RDZV_ENDPOINT")
    if source:
        sources["rdzv_endpoint"] = source
    backend, _ = _first(environ, "PET_RDZV_BACKEND")
    rdzv_id, _ = _first(environ, "PET_RDZV_ID")
    conf = _parse_conf(environ.get("PET_RDZV_CONF"))

    raw, source = _first(environ, "PET_MAX_RESTARTS")
    max_restarts = _int(raw, source) if raw is not None else None
    nproc, _ = _first(environ, "PET_NPROC_PER_NODE")

    if endpoint or (max_nodes > 1 and min_nodes != max_nodes):
        mode = "static" if backend == "static" else "dynamic"
        if not endpoint:
            if not master_addr:
                raise ConfigError(
                    f"an elastic node range {min_nodes}:{max_nodes} needs PET_RDZV_ENDPOINT or PET_MASTER_ADDR/"
                    "MASTER_ADDR: the address every node meets at"
                )
            endpoint = f"{master_addr}:{master_port}"
            sources["rdzv_endpoint"] = sources["master_addr"]
    elif max_nodes > 1:
        mode = "static"
        if not master_addr:
            raise ConfigError(
                f"{sources['nnodes']}={max_nodes} needs the address of node 0: set PET_MASTER_ADDR or MASTER_ADDR"
            )
    else:
        mode = "standalone"
        if node_rank > 0:
            # Node 1 of a job that forgot its size would otherwise train alone, unnoticed.
            raise ConfigError(
                f"{sources['node_rank']}={node_rank} but the job has one node: "
                "set PET_NNODES or NNODES to the node count"
            )
    if mode == "static" and node_rank >= max_nodes:
        raise ConfigError(
            f"{sources.get('node_rank', 'node rank')}={node_rank}: expected 0..{max_nodes - 1} "
            f"for {sources['nnodes']}={max_nodes}"
        )
    if mode == "dynamic":
        backend = backend or "c10d"
        rdzv_id = rdzv_id or DEFAULT_RDZV_ID
    return Topology(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=node_rank if mode != "standalone" else 0,
        mode=mode,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint if mode != "standalone" else None,
        rdzv_id=rdzv_id,
        rdzv_conf=conf,
        max_restarts=max_restarts,
        nproc_per_node=nproc,
        sources=sources,
    )


# ------------------------------------------------------------------------------------------------- decisions


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
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{source}={value!r}: expected a positive integer, auto, gpu or cpu")
    count = int(value)
    if gpu_count and count > gpu_count:
        raise ConfigError(
            f"{source}={count}: only {gpu_count} GPU(s) are visible; a rank per GPU means at most {gpu_count}"
        )
    return count, source


@dataclass(frozen=True)
class Precision:
    name: str  # bf16 | fp16 | fp32
    tf32: bool
    flags: tuple[str, ...]  # decision flags for the ranks (empty when the user chose)
    source: str


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
        name = "bf16" if bf16 else "fp16" if fp16 else "fp32"
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
                str(self.per_device * self.processes * n * self.accumulation) for n in (self.min_nodes, self.max_nodes)
            )
        )
        return (
            f"batch: {self.per_device} per device x {_plural(self.processes, self.unit)} x "
            f"{nodes} node{'s' if self.max_nodes > 1 else ''} x {self.accumulation} accumulation = {total} global"
        )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'es' if word.endswith('s') and count != 1 else 's' if count != 1 else ''}"


def decide_batch(
    per_device: int,
    accumulation: int,
    accumulation_source: str | None,
    global_batch_size: int | None,
    global_source: str,
    processes: int,
    topology: Topology,
    unit: str,
) -> Batch:
    """Derive gradient accumulation from the global batch (samples per optimizer step across all ranks)."""
    flags: tuple[str, ...] = ()
    if global_batch_size is None:
        total = None if topology.elastic else per_device * processes * topology.max_nodes * accumulation
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
        options = " or ".join(str(n) for n in (lower, higher) if n > 0)
        hint = (
            f"; or per_device_train_batch_size={global_batch_size // world}" if global_batch_size % world == 0 else ""
        )
        raise ConfigError(
            f"{global_source}={global_batch_size}: not a multiple of {per_device} per device x "
            f"{_plural(processes, unit)} x {_plural(topology.max_nodes, 'node')} = {step}; use {options}{hint}"
        )
    derived = global_batch_size // step
    if accumulation_source and accumulation != derived:
        raise ConfigError(
            f"{accumulation_source}={accumulation} contradicts {global_source}={global_batch_size}, which needs "
            f"{derived} on {_plural(world, unit)} at {per_device} per device; set only one of them"
        )
    if not accumulation_source:
        flags = ("--gradient_accumulation_steps", str(derived))
    return Batch(per_device, processes, topology.min_nodes, topology.max_nodes, derived, global_batch_size, flags, unit)


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


def shm_size(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def wait_for_address(
    host: str,
    source: str,
    timeout_s: float,
    log: Callable[[str], None],
    resolve: Callable[[str], object] = lambda host: socket.getaddrinfo(host, None),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Wait until ``host`` resolves: a Kubernetes Service name appears some seconds after the pods start.

    Returns the number of failed attempts; raises a UserError with exit code 1 when ``timeout_s`` passes: not 3,
    because a master pod still Pending (no GPU free yet) is worth retrying, and the podFailurePolicy fails the Job
    at once on 3.
    """
    deadline = clock() + timeout_s
    delay, failures = 1.0, 0
    while True:
        try:
            resolve(host)
            if failures:
                log(f"{source}={host} resolves now (after {failures} failed attempts)")
            return failures
        except OSError as exc:
            failures += 1
            left = deadline - clock()
            if left <= 0:
                raise UserError(
                    f"{source}={host!r} did not resolve within {timeout_s:.0f}s ({exc}); check that the master "
                    "pod and its headless Service exist (or raise MLM_RDZV_TIMEOUT)",
                    exit_code=EXIT_RETRY,
                ) from None
            log(f"waiting for {source}={host} to resolve (attempt {failures}, {left:.0f}s left): {exc}")
            sleep(min(delay, left))
            delay = min(delay * 2, 10.0)


# ------------------------------------------------------------------------------------------------------ plan


@dataclass
class Plan:
    inventory: Inventory
    topology: Topology
    nproc_per_node: int
    nproc_source: str
    cpu_mode: bool
    backend: str
    precision: Precision
    batch: Batch
    max_restarts: int
    decision_flags: list[str]
    decided: dict[str, Any]  # the option values the decision flags set
    env: dict[str, str]  # set in torchrun's environment
    warnings: list[str]
    command: list[str]


def torchrun_path() -> list[str]:
    """The torchrun of this interpreter's environment (a bare `torchrun` on PATH may belong to another)."""
    candidate = Path(sys.executable).with_name("torchrun")
    if candidate.exists():
        return [str(candidate)]
    return [sys.executable, "-m", "torch.distributed.run"]


def make_plan(
    config: Any,
    inventory: Inventory,
    environ: Mapping[str, str],
    user_argv: Sequence[str],
    torch_cuda: str | None = None,
    cpu_count: int = 1,
    torchrun: Sequence[str] = ("torchrun",),
    log_format: str = "json",
    shm_bytes: int | None = MIN_SHM_BYTES,
) -> Plan:
    """Every launch decision, from the resolved config, the GPU inventory and the cluster environment."""
    job, training, sources = config.job, config.training, config.sources
    warnings: list[str] = []
    topology = topology_from_env(environ)

    cpu_mode = not inventory.gpus or bool(training.use_cpu)
    if cpu_mode:
        reason = "use_cpu is set" if inventory.gpus else inventory.cpu_reason
        if job.require_gpu:
            raise EnvironmentProblem(
                f"{config.source_of('require_gpu')} asks for a GPU but none is used: {reason}; give the container "
                "GPUs (docker run --gpus all; Kubernetes: resources.limits nvidia.com/gpu) or unset it to use the CPU"
            )
        warnings.append(f"no GPU visible: CPU mode ({reason})")
    else:
        driver_warning = check_driver(inventory, torch_cuda)
        if driver_warning:
            warnings.append(driver_warning)

    gpu_count = 0 if cpu_mode else len(inventory.gpus)
    nproc, nproc_source = decide_nproc(
        job.nproc_per_node, config.source_of("nproc_per_node"), topology.nproc_per_node, gpu_count, cpu_count
    )
    gpus_used = inventory.gpus[:nproc] if not cpu_mode else []

    decided: dict[str, Any] = {}
    flags: list[str] = []
    if job.log_format == "auto":
        # Resolved once, on the launcher's terminal: a rank's stdout is a pipe whenever torchrun filters output.
        decided["log_format"] = log_format
        flags += ["--log_format", log_format]
    if cpu_mode and not training.use_cpu:
        if "use_cpu" in sources:
            warnings.append(
                f"{sources['use_cpu']}=false on a node without GPU: CPU ranks get a process group but no DDP, "
                "so each would train its own copy; remove it"
            )
        else:
            # accelerate wraps CPU ranks in DDP only with use_cpu: without it every rank trains its own copy of the
            # model on its shard and gradients are never averaged (transformers 5.24 / accelerate 1.15).
            flags += ["--use_cpu", "true"]
            decided["use_cpu"] = True
    backend = training.ddp_backend if "ddp_backend" in sources and training.ddp_backend else None
    if backend is None:
        backend = "gloo" if cpu_mode else "nccl"
        flags += ["--ddp_backend", backend]
        decided["ddp_backend"] = backend

    capability = min((g.compute_capability for g in gpus_used), default=None)
    user_precision = {name: sources[name] for name in ("fp16", "bf16", "tf32") if name in sources}
    precision = decide_precision(training.fp16, training.bf16, training.tf32, user_precision, capability)
    flags += precision.flags
    for flag in precision.flags[::2]:
        decided[flag.removeprefix("--")] = True

    accumulation_source = sources.get("gradient_accumulation_steps")
    batch = decide_batch(
        training.per_device_train_batch_size,
        training.gradient_accumulation_steps,
        accumulation_source,
        job.global_batch_size,
        config.source_of("global_batch_size"),
        nproc,
        topology,
        "process" if cpu_mode else "GPU",
    )
    flags += batch.flags
    if batch.flags:
        decided["gradient_accumulation_steps"] = batch.accumulation

    warning = shm_warning(shm_bytes, training.dataloader_num_workers)
    if warning:
        warnings.append(warning)

    if "max_restarts" in sources or topology.max_restarts is None:
        max_restarts = job.max_restarts
    else:
        max_restarts = topology.max_restarts

    env = {
        # NVML numbers GPUs in PCI bus order; CUDA's default (fastest first) could differ.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        # The devices decided here, by UUID, so ranks use exactly them whatever the runtime exposed.
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus_used),
    }
    if not environ.get("OMP_NUM_THREADS"):
        # torchrun would set 1 thread per rank; share the cores instead.
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // nproc))

    command = [*torchrun, *_torchrun_flags(topology, nproc, max_restarts, job.rdzv_timeout, job.log_ranks)]
    command += ["-m", JOB_MODULE, *user_argv, *flags]
    return Plan(
        inventory=inventory,
        topology=topology,
        nproc_per_node=nproc,
        nproc_source=nproc_source,
        cpu_mode=cpu_mode,
        backend=backend,
        precision=precision,
        batch=batch,
        max_restarts=max_restarts,
        decision_flags=flags,
        decided=decided,
        env=env,
        warnings=warnings,
        command=command,
    )


def _torchrun_flags(topology: Topology, nproc: int, max_restarts: int, rdzv_timeout: int, log_ranks: str) -> list[str]:
    flags = ["--nnodes", topology.nnodes, "--nproc-per-node", str(nproc)]
    conf: dict[str, str] = {}
    if topology.mode == "standalone":
        flags.append("--standalone")
    elif topology.mode == "static":
        flags += ["--node-rank", str(topology.node_rank)]
        if topology.rdzv_endpoint:
            flags += ["--rdzv-backend", "static", "--rdzv-endpoint", topology.rdzv_endpoint]
        else:
            flags += ["--master-addr", str(topology.master_addr), "--master-port", str(topology.master_port)]
        conf["timeout"] = str(rdzv_timeout)  # how long node 0's store waits for the others
    else:
        flags += ["--rdzv-backend", str(topology.rdzv_backend), "--rdzv-endpoint", str(topology.rdzv_endpoint)]
        flags += ["--rdzv-id", str(topology.rdzv_id)]
        conf["join_timeout"] = str(rdzv_timeout)
    if topology.mode != "standalone":
        conf.update(topology.rdzv_conf)
        flags += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())]
    flags += ["--max-restarts", str(max_restarts)]
    if log_ranks.strip() != "all":
        flags += ["--local-ranks-filter", log_ranks.replace(" ", "")]
    return flags


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command as shown in logs and plan: secret option values replaced."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append("***")
            hide_next = False
        elif arg in SECRET_FLAGS:
            shown.append(arg)
            hide_next = True
        elif arg.startswith(tuple(f"{flag}=" for flag in SECRET_FLAGS)):
            shown.append(arg.split("=", 1)[0] + "=***")
        else:
            shown.append(arg)
    return shown


def plan_document(plan: Plan, config: Any, torch_cuda: str | None) -> dict[str, Any]:
    """The JSON document ``plan`` prints."""
    topology, inventory = plan.topology, plan.inventory
    resolved = config.as_dict(redact=True)
    resolved.update(plan.decided)
    world = None if topology.elastic else plan.nproc_per_node * topology.max_nodes
    return {
        "gpus": [] if plan.cpu_mode else inventory.as_dict()["gpus"][: plan.nproc_per_node],
        "cpu_mode": plan.cpu_mode,
        "cpu_reason": inventory.cpu_reason if not inventory.gpus else ("use_cpu is set" if plan.cpu_mode else None),
        "driver_version": inventory.driver_version,
        "cuda_driver_version": inventory.as_dict()["cuda_driver_version"],
        "torch_cuda": torch_cuda,
        "nproc_per_node": plan.nproc_per_node,
        "nproc_per_node_source": plan.nproc_source,
        "nnodes": topology.max_nodes if not topology.elastic else topology.nnodes,
        "node_rank": topology.node_rank,
        "world_size": world,
        "rendezvous": {
            "mode": topology.mode,
            "master_addr": topology.master_addr,
            "master_port": topology.master_port,
            "backend": topology.rdzv_backend,
            "endpoint": topology.rdzv_endpoint,
            "id": topology.rdzv_id,
        },
        "topology_sources": topology.sources,
        "backend": plan.backend,
        "precision": plan.precision.name,
        "tf32": plan.precision.tf32,
        "precision_source": plan.precision.source,
        "per_device_train_batch_size": plan.batch.per_device,
        "gradient_accumulation_steps": plan.batch.accumulation,
        "global_batch_size": plan.batch.global_batch_size,
        "batch": plan.batch.banner,
        "max_restarts": plan.max_restarts,
        "decision_flags": plan.decision_flags,
        "env": plan.env,
        "warnings": plan.warnings,
        "notes": inventory.notes,
        "command": redact_argv(plan.command),
        "config": resolved,
    }


# ---------------------------------------------------------------------------------------------------- running


@contextlib.contextmanager
def as_launcher() -> Iterator[None]:
    """Load the config as a launcher, not as a rank.

    TrainingArguments sets up a device when built: on a GPU machine that is torch.cuda.set_device(0), a CUDA
    context the launcher would hold on GPU 0 for the whole run (and that fails rank 0 in EXCLUSIVE_PROCESS compute
    mode); with a PyTorchJob's WORLD_SIZE/RANK in the environment it would even start a process group.
    """
    saved = {name: os.environ.pop(name) for name in RANK_ENV if name in os.environ}
    previous_cpu = os.environ.get("ACCELERATE_USE_CPU")
    os.environ["ACCELERATE_USE_CPU"] = "true"
    try:
        yield
    finally:
        os.environ.update(saved)
        if previous_cpu is None:
            os.environ.pop("ACCELERATE_USE_CPU", None)
        else:
            os.environ["ACCELERATE_USE_CPU"] = previous_cpu


def resolve_log_format(log_format: str) -> str:
    """auto: text on a terminal, JSON lines otherwise (judged on the launcher's stdout, as the ranks' would be)."""
    if log_format in ("text", "json"):
        return log_format
    try:
        return "text" if sys.stdout.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


class _Log:
    """One line per event on stderr: text for a person, a JSON record (event "launch") for a log collector."""

    def __init__(self, log_format: str) -> None:
        self.json = log_format == "json"

    def __call__(self, message: str, level: str = "info") -> None:
        if self.json:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            line = json.dumps({"event": "launch", "time": stamp, "level": level, "message": message})
        else:
            line = f"mlm-trainer: {'' if level == 'info' else level + ': '}{message}"
        print(line, file=sys.stderr, flush=True)


def _child_env(environ: Mapping[str, str], plan: Plan, exit_dir: str) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not k.startswith("PET_")}
    env.update(plan.env)
    env[EXIT_DIR_ENV] = exit_dir
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _die_with_parent() -> None:
    """In torchrun's process: get SIGTERM if the launcher dies (a killed launcher must not leave ranks behind)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


EXIT_RETRY = 1  # a plain failure: the Job controller retries it

# torchrun's agent reports a failed rank with an ERROR log line ("E1130 12:00:00.000 123 .../api.py:1002] failed
# (exitcode: 2) ...") followed by its own traceback and a summary table. When the rank failed with a documented
# code it has already printed the one line a user needs, so that report is held back and dropped.
_AGENT_REPORT = re.compile(rb"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/elastic/.*\] failed")


class _StderrRelay:
    """Passes torchrun's stderr through as it comes, holding back everything from the agent's failure report on."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.partial = b""
        self.held: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if self.held or _AGENT_REPORT.match(line):
                self.held.append(line + b"\n")
            else:
                self.sink.write(line + b"\n")
        # Progress bars redraw with \r and no newline: show them now, unless this may be the start of a report line.
        if self.partial and not self.held and not re.match(rb"[EWI]\d", self.partial):
            self.sink.write(self.partial)
            self.partial = b""
        self.sink.flush()

    def finish(self, drop_report: bool) -> None:
        if self.partial:
            if self.held:
                self.held.append(self.partial)
            else:
                self.sink.write(self.partial)
            self.partial = b""
        if not drop_report:
            for line in self.held:
                self.sink.write(line)
        self.sink.flush()


def run_torchrun(
    command: Sequence[str], env: Mapping[str, str], log: Callable[..., None], exit_dir: str, debug: bool = False
) -> int:
    """Run torchrun as a child in its own process group, forwarding SIGTERM/SIGINT; return its exit status.

    Its own group: a Ctrl-C on a terminal reaches only the launcher, which forwards it once (torchrun passes it
    on to the ranks), instead of every process receiving it twice. The handlers are in place before the child
    starts, so a signal arriving in between is held and delivered, not lost. Its stderr is relayed so that the
    agent's failure report can be dropped when a rank already said what went wrong (MLM_DEBUG=1 keeps it).
    """
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        log(f"{signal.Signals(signum).name} received: passing it to torchrun (ranks checkpoint and exit)")
        if child is None:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    relay = _StderrRelay(sys.stderr.buffer)
    try:
        child = subprocess.Popen(
            list(command), env=dict(env), process_group=0, preexec_fn=_die_with_parent, stderr=subprocess.PIPE
        )
        for signum in pending:
            child.send_signal(signum)
        assert child.stderr is not None
        while chunk := child.stderr.read1(65536):
            relay.feed(chunk)
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    documented = documented_exit(read_exit_codes(exit_dir), 0) != 0
    relay.finish(drop_report=documented and not debug)
    # A negative status is death by that signal: report it the way a shell does.
    return 128 + -status if status < 0 else status


def launch(plan: Plan, environ: Mapping[str, str], log: Callable[..., None], rdzv_timeout: int) -> int:
    target = plan.topology.address_to_wait_for
    if target:
        wait_for_address(*target, timeout_s=rdzv_timeout, log=lambda m: log(m, "warning"))
    exit_dir = tempfile.mkdtemp(prefix="mlm-exit-")
    try:
        log("torchrun: " + " ".join(redact_argv(plan.command)))
        debug = environ.get("MLM_DEBUG", "") not in ("", "0", "false")
        status = run_torchrun(plan.command, _child_env(environ, plan, exit_dir), log, exit_dir, debug)
        codes = read_exit_codes(exit_dir)
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)
    code = 0 if status == 0 else documented_exit(codes, status)
    if code in (EXIT_CONFIG, EXIT_ENVIRONMENT, EXIT_PREEMPTED):
        log(f"exit {code}, as the ranks reported (see the line above)")
    elif code:
        log(f"torchrun exited {status}; no rank reported a documented exit code: a crash", "error")
    return code


def _summary(plan: Plan) -> str:
    topology = plan.topology
    if plan.cpu_mode:
        devices = f"CPU, {_plural(plan.nproc_per_node, 'process')}"
    else:
        names = sorted({g.name for g in plan.inventory.gpus[: plan.nproc_per_node]})
        devices = f"{_plural(plan.nproc_per_node, 'GPU')} ({', '.join(names)})"
    nodes = f"{topology.nnodes} node(s), node rank {topology.node_rank}, {topology.mode} rendezvous"
    precision = plan.precision.name + (" + tf32" if plan.precision.tf32 else "")
    return f"{devices}; {nodes}; backend {plan.backend}; precision {precision} ({plan.precision.source})"


USAGE = "usage: python -m train.launch {train|plan} [--option value ...]"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``train``: launch and exit with the documented code; ``plan``: print the decisions as JSON."""
    args = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    command = "train"
    if args and not args[0].startswith("-"):
        command = args.pop(0)
    if command not in ("train", "plan"):
        raise ConfigError(f"unknown command {command!r}; {USAGE}")

    with as_launcher():
        config = load_config(args, environ)
    log_format = resolve_log_format(config.job.log_format)
    log = _Log(log_format)
    inventory = detect(environ)
    torch_cuda = torch_cuda_version()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    plan = make_plan(config, inventory, environ, args, torch_cuda, cpus, torchrun_path(), log_format, shm_size())
    # The job's own check, before torchrun: an unwritable output_dir (3) or a finished final/ there (2).
    check_output_dir(config)

    if command == "plan":
        print(json.dumps(plan_document(plan, config, torch_cuda), indent=2, default=str))
        return 0
    for warning in plan.warnings:
        log(warning, "warning")
    log(_summary(plan))
    log(plan.batch.banner)
    return launch(plan, environ, log, config.job.rdzv_timeout)


if __name__ == "__main__":
    sys.exit(run_main(main))
