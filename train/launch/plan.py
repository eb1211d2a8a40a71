"""The plan: every launch decision for this node in one value, the torchrun command that carries it out, and the
JSON document ``plan`` prints.

Decisions reach the ranks as extra option flags appended after the user's (highest precedence), as a few
environment variables (the GPUs by UUID, thread counts) and as the :class:`~train.common.handoff.Handoff` record of
facts they show but must not recompute. torchrun would also read any PET_* variable behind our back, so they are
removed from its environment (torchrun.py): the ``command`` in ``plan`` is exactly what runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from train.common.errors import STOP_SIGNALS, EnvironmentProblem
from train.common.handoff import HANDOFF_ENV, Handoff
from train.common.hf import arguments_without_models
from train.config import SECRET_FIELDS, Config, LaunchArguments, ScheduleArguments, env_name, load_config
from train.config.recipes import recipe_summary
from train.launch.deadline import Deadline, deadline_document, launched_at, run_deadline
from train.launch.decide import (
    Batch,
    BatchOptions,
    Precision,
    decide_backend,
    decide_batch,
    decide_log_format,
    decide_max_restarts,
    decide_nproc,
    decide_pad_multiple,
    decide_precision,
    decide_use_cpu,
    plural,
    shm_warning,
)
from train.launch.inputs import Host, Launch
from train.launch.topology import Topology, topology_from_env
from train.machine.gpus import Gpu, Inventory, check_driver

# Variables that make accelerate (inside TrainingArguments) believe this process is a rank. The launcher is not
# one: a PyTorchJob pod carries WORLD_SIZE/RANK for its torchrun, and with them accelerate would start a process
# group in the launcher and wait for peers that never come.
RANK_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


@dataclass(frozen=True)
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
    # Secret options, for the ranks' environment only: never in the command, the plan document or a log.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    deadline: Deadline | None = None  # when the run must be over (time_budget), and what set it

    @property
    def gpus_used(self) -> list[Gpu]:
        """The GPUs the ranks of this node use, in order (none in CPU mode)."""
        return [] if self.cpu_mode else self.inventory.gpus[: self.nproc_per_node]


def torchrun_path() -> list[str]:
    """The torchrun of this interpreter's environment (a bare `torchrun` on PATH may belong to another)."""
    candidate = Path(sys.executable).with_name("torchrun")
    if candidate.exists():
        return [str(candidate)]
    return [sys.executable, "-m", "torch.distributed.run"]


def make_plan(
    config: Config, host: Host, environ: Mapping[str, str], user_argv: Sequence[str], launch: Launch = Launch()
) -> Plan:
    """Every launch decision, from the resolved config, this node (``host``: its GPU inventory, CPUs, /dev/shm)
    and the cluster environment, in the order the launcher makes them (a refusal raises from the step that makes
    it); ``launch``: how the ranks are started. It takes the whole Config because it assembles the plan: each
    decision is handed the section or the values it reads."""
    training, sources = config.training, config.sources
    inventory, torch_cuda, cpu_count = host.inventory, host.torch_cuda, host.cpu_count
    topology = topology_from_env(environ)
    cpu_mode, device_warning = decide_device(training.use_cpu, config.launch, inventory, torch_cuda)
    gpu_count = 0 if cpu_mode else len(inventory.gpus)
    nproc, nproc_source = decide_nproc(
        config.launch.nproc_per_node, config.source_of("nproc_per_node"), topology.nproc_per_node, gpu_count, cpu_count
    )
    gpus_used = inventory.gpus[:nproc] if not cpu_mode else []
    log_flags = decide_log_format(config.launch.log_format, launch.log_format)
    use_cpu_flags, use_cpu_warning = decide_use_cpu(training.use_cpu, sources.get("use_cpu"), cpu_mode)
    backend, backend_flags = decide_backend(training.ddp_backend if "ddp_backend" in sources else None, cpu_mode)
    precision = precision_for(training, sources, gpus_used)
    batch = batch_for(training, config.schedule, sources, nproc, topology, cpu_mode)
    pad_flags = decide_pad_multiple(config.data.pad_to_multiple_of, sources.get("pad_to_multiple_of"), cpu_mode)
    shm = shm_warning(host.shm_bytes, training.dataloader_num_workers)
    max_restarts = decide_max_restarts(config.launch.max_restarts, "max_restarts" in sources, topology)
    started = launched_at()  # once: the deadline counts from it, and the ranks' quality curve too
    deadline = run_deadline(config.budget, environ, started)

    # The decision flags go after the user's (highest precedence), in the order decided.
    flags = [*log_flags, *use_cpu_flags, *backend_flags, *precision.flags, *batch.flags, *pad_flags]
    user_flags, secret_env = split_secret_flags(user_argv)
    torchrun_flags = _torchrun_flags(topology, nproc, max_restarts, config.launch)
    command = [*launch.torchrun, *torchrun_flags, "-m", launch.module, *user_flags, *flags]
    plan = Plan(
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
        decided=option_values(flags),
        env=rank_env(environ, gpus_used, nproc, cpu_count),
        warnings=[warning for warning in (device_warning, use_cpu_warning, shm) if warning],
        command=command,
        secret_env=secret_env,
        deadline=deadline,
    )
    return replace(plan, env={**plan.env, HANDOFF_ENV: handoff(plan, started).to_env()})


def decide_device(
    use_cpu: bool, launch: LaunchArguments, inventory: Inventory, torch_cuda: str | None
) -> tuple[bool, str | None]:
    """Whether the ranks run on the CPU (no GPU visible, or use_cpu), and the plan's warning about the device: CPU
    mode and why, or an older driver's. Refused when a GPU is required (``launch.require_gpu``) and none is used,
    or when this torch cannot use the visible GPUs (train.machine.gpus.check_driver)."""
    if inventory.gpus and not use_cpu:
        return False, check_driver(inventory, torch_cuda)
    reason = "use_cpu is set" if inventory.gpus else inventory.cpu_reason
    if launch.require_gpu:
        raise EnvironmentProblem(
            f"{launch.source_of('require_gpu')} asks for a GPU but none is used: {reason}; give the container "
            "GPUs (docker run --gpus all; Kubernetes: resources.limits nvidia.com/gpu) or unset it to use the CPU"
        )
    return True, f"no GPU visible: CPU mode ({reason})"


def precision_for(training: TrainingArguments, sources: Mapping[str, str], gpus_used: Sequence[Gpu]) -> Precision:
    """The precision for the GPUs used (the lowest compute capability among them; none on CPU), or the user's
    (fp16, bf16, tf32 set: in ``sources``)."""
    capability = min((g.compute_capability for g in gpus_used), default=None)
    user_precision = {name: sources[name] for name in ("fp16", "bf16", "tf32") if name in sources}
    return decide_precision(training.fp16, training.bf16, training.tf32, user_precision, capability)


def batch_for(
    training: TrainingArguments,
    schedule: ScheduleArguments,
    sources: Mapping[str, str],
    nproc: int,
    topology: Topology,
    cpu_mode: bool,
) -> Batch:
    """The global batch and the gradient accumulation it implies for ``nproc`` processes per node (``sources``: where
    gradient_accumulation_steps was set, if it was)."""
    options = BatchOptions(
        per_device=training.per_device_train_batch_size,
        accumulation=training.gradient_accumulation_steps,
        accumulation_source=sources.get("gradient_accumulation_steps"),
        global_batch_size=schedule.global_batch_size,
        global_source=schedule.source_of("global_batch_size"),
    )
    return decide_batch(options, nproc, topology, "process" if cpu_mode else "GPU")


def option_values(flags: Sequence[str]) -> dict[str, Any]:
    """The option values the decision flags set (``--name value`` pairs), as the ranks' parser reads them: true,
    a whole number or a word. The plan document's config shows them."""
    values: dict[str, Any] = {}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        values[flag.removeprefix("--")] = True if value == "true" else int(value) if value.isdecimal() else value
    return values


def rank_env(environ: Mapping[str, str], gpus_used: Sequence[Gpu], nproc: int, cpu_count: int) -> dict[str, str]:
    """The variables set in torchrun's environment for the ranks (the hand-off record aside)."""
    env = {
        # NVML numbers GPUs in PCI bus order; CUDA's default (fastest first) could differ.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        # The devices decided here, by UUID, so ranks use exactly them whatever the runtime exposed.
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus_used),
    }
    if not environ.get("OMP_NUM_THREADS"):
        # torchrun would set 1 thread per rank; share the cores instead.
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // nproc))
    if "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT" not in environ:
        # MLflow's end_run prints a "View run ... at: URL" line on stdout, which in JSON mode is not a JSON line;
        # the URL is in the tracking server anyway.
        env["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    return env


def sharding_plan(plan: Plan, requested: str, estimate: dict[str, int] | None) -> dict[str, Any]:
    """What ``plan`` and ``doctor`` say of the sharding: the mode asked for (``requested``: MLM_SHARDING), the GPU
    memory ``auto`` fits DDP into, DDP's ``estimate`` (train/model/memory.py planned_estimate: the model built on the
    meta device; None where its config is not readable here) and the mode the ranks' own rule will choose with it."""
    from train.model.memory import choose_sharding  # here: a launch need not load the models

    gpu_memory = smallest_memory([] if plan.cpu_mode else plan.inventory.gpus[: plan.nproc_per_node])
    facts: dict[str, Any] = {"requested": requested, "smallest_gpu_memory_bytes": gpu_memory}
    facts |= {"ddp_estimate": estimate, "mode": None}
    facts["choice"] = "decided by the ranks once they have read the model's config (not readable here)"
    if estimate is not None:
        world = plan.nproc_per_node * plan.topology.max_nodes
        facts["mode"], facts["choice"] = choose_sharding(requested, estimate, gpu_memory, world)
    return facts


def smallest_memory(gpus: Sequence[Gpu]) -> int | None:
    """The memory of the smallest GPU a rank gets (what MLM_SHARDING=auto fits DDP into); None on CPU."""
    return min((g.memory_total_bytes for g in gpus), default=None)


def handoff(plan: Plan, started: float | None = None) -> Handoff:
    """The facts of the plan the ranks show but must not recompute (:class:`~train.common.handoff.Handoff`);
    ``started``: when the launcher started."""
    precision, batch, gpus_used, deadline = plan.precision, plan.batch, plan.gpus_used, plan.deadline
    return Handoff(
        precision=precision.label,
        global_batch_size=batch.global_batch_size,
        batch=batch.banner,
        nnodes=plan.topology.nnodes,
        gpus=[g.name for g in gpus_used],
        gpu_uuids=[g.uuid for g in gpus_used],
        command=plan.command,
        # The launcher checks this node's output location and cache before it starts torchrun (__main__.py): the
        # ranks need not write probes and ask the store again.
        outputs_checked=True,
        decided=list(plan.decided),
        deadline=deadline.at if deadline else None,
        deadline_source=deadline.source if deadline else "",
        budget_s=deadline.budget_s if deadline else None,
        launched_at=started,
        gpu_memory_bytes=smallest_memory(gpus_used),
    )


# What torchrun forwards to the ranks: its own defaults, and our stop signals (its list lacks Slurm's SIGUSR1/2).
TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
SIGNALS_TO_HANDLE = ",".join(dict.fromkeys([*TORCHRUN_SIGNALS, *(s.name for s in STOP_SIGNALS)]))


def _torchrun_flags(topology: Topology, nproc: int, max_restarts: int, launch: LaunchArguments) -> list[str]:
    rdzv_timeout, log_ranks = launch.rdzv_timeout, launch.log_ranks
    flags = ["--nnodes", topology.nnodes, "--nproc-per-node", str(nproc)]
    conf: dict[str, str] = {}
    if topology.is_standalone:
        flags.append("--standalone")
    elif topology.is_static:
        flags += ["--node-rank", str(topology.node_rank)]
        if topology.rdzv_endpoint:
            flags += ["--rdzv-backend", "static", "--rdzv-endpoint", topology.rdzv_endpoint]
        else:
            flags += ["--master-addr", str(topology.master_addr), "--master-port", str(topology.master_port)]
        if topology.rdzv_id:  # a Slurm job id, or PET_RDZV_ID: torchrun's logs name the run by it
            flags += ["--rdzv-id", topology.rdzv_id]
        conf["timeout"] = str(rdzv_timeout)  # how long node 0's store waits for the others
    else:  # dynamic
        flags += ["--rdzv-backend", str(topology.rdzv_backend), "--rdzv-endpoint", str(topology.rdzv_endpoint)]
        flags += ["--rdzv-id", str(topology.rdzv_id)]
        conf["join_timeout"] = str(rdzv_timeout)
    if not topology.is_standalone:
        conf.update(topology.rdzv_conf)
        flags += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())]
    flags += ["--max-restarts", str(max_restarts)]
    # How long the ranks have to checkpoint after a stop signal before torchrun kills them (its default is 30 s).
    flags += ["--shutdown-timeout", str(launch.stop_timeout), "--signals-to-handle", SIGNALS_TO_HANDLE]
    if log_ranks.strip() != "all":
        flags += ["--local-ranks-filter", log_ranks.replace(" ", "")]
    return flags


def split_secret_flags(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The user's flags without the secret options (``--hub_token X``), and those as environment variables for the
    ranks (``MLM_HUB_TOKEN``): a flag is readable by every process on the machine in /proc/PID/cmdline."""
    flags = {f"--{name}": env_name(name) for name in SECRET_FIELDS}
    kept: list[str] = []
    secrets: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        flag, sep, value = arg.partition("=")
        if flag in flags:
            secrets[flags[flag]] = value if sep else next(args, "")
        else:
            kept.append(arg)
    return kept, secrets


def plan_document(plan: Plan, config: Config, torch_cuda: str | None) -> dict[str, Any]:
    """The JSON document ``plan`` prints. It takes the whole Config because the document shows it whole: every
    resolved option, the recipe, and DDP's estimate from the model's options."""
    from train.model.memory import planned_estimate  # here: a launch need not load the models

    estimate = planned_estimate(config.model, config.training, config.data.max_seq_length)
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
        "command": plan.command,
        "deadline": deadline_document(plan.deadline),
        "sharding": sharding_plan(plan, config.launch.sharding, estimate),
        "recipe": recipe_summary(
            config.model.recipe, config.model.model_name_or_path, config.training, config.schedule.decay_ratio
        ),
        "config": resolved,
    }


def summary(plan: Plan) -> str:
    """The one line the launcher logs before torchrun starts."""
    topology = plan.topology
    if plan.cpu_mode:
        devices = f"CPU, {plural(plan.nproc_per_node, 'process')}"
    else:
        names = sorted({g.name for g in plan.inventory.gpus[: plan.nproc_per_node]})
        devices = f"{plural(plan.nproc_per_node, 'GPU')} ({', '.join(names)})"
    nodes = f"{topology.nnodes} node(s), node rank {topology.node_rank}, {topology.mode} rendezvous"
    return f"{devices}; {nodes}; backend {plan.backend}; precision {plan.precision.label} ({plan.precision.source})"


@contextlib.contextmanager
def as_launcher() -> Iterator[None]:
    """Load the config as a launcher, not as a rank.

    TrainingArguments sets up a device when built: on a GPU machine that is torch.cuda.set_device(0), a CUDA
    context the launcher would hold on GPU 0 for the whole run (and that fails rank 0 in EXCLUSIVE_PROCESS compute
    mode); with a PyTorchJob's WORLD_SIZE/RANK in the environment it would even start a process group. And the
    launcher never builds a model, so it does not import transformers' model code (hf.arguments_without_models).
    """
    saved = {name: os.environ.pop(name) for name in RANK_ENV if name in os.environ}
    previous_cpu = os.environ.get("ACCELERATE_USE_CPU")
    os.environ["ACCELERATE_USE_CPU"] = "true"
    try:
        with arguments_without_models():
            yield
    finally:
        os.environ.update(saved)
        if previous_cpu is None:
            os.environ.pop("ACCELERATE_USE_CPU", None)
        else:
            os.environ["ACCELERATE_USE_CPU"] = previous_cpu


def launcher_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """The resolved options, loaded as a launcher (``plan``, ``doctor`` and a launch all start here)."""
    with as_launcher():
        return load_config(argv, environ)
