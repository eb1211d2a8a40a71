"""What a plan is made from besides the options and the cluster environment: this node as the launcher found it
(:class:`Host`) and how its ranks are started (:class:`Launch`). ``launch`` and ``doctor`` build them the same way
and hand them to train/launch/plan.py's make_plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from train.launch.decide import MIN_SHM_BYTES
from train.machine.gpus import Inventory

JOB_MODULE = "train.run.job"
EVALUATE_MODULE = "train.commands.evaluate"  # ./entrypoint.sh evaluate: the same launch, scoring instead of training
FINETUNE_MODULE = "train.commands.finetune"  # ./entrypoint.sh finetune: the same launch, a downstream task's score


@dataclass(frozen=True)
class Host:
    """This node as the launcher found it: the GPUs, torch's CUDA, the CPUs it may use and /dev/shm's size."""

    inventory: Inventory
    torch_cuda: str | None = None  # the CUDA version torch was built for (None: a CPU build)
    cpu_count: int = 1
    shm_bytes: int | None = MIN_SHM_BYTES  # None: no /dev/shm


@dataclass(frozen=True)
class Launch:
    """How the ranks are started: torchrun, the log format (decided on the launcher's terminal), their module."""

    torchrun: Sequence[str] = ("torchrun",)
    log_format: str = "json"
    module: str = JOB_MODULE  # the job, evaluate (EVALUATE_MODULE) or finetune (FINETUNE_MODULE)
