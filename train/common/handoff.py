"""What the launcher hands every rank besides option flags: the facts of its decisions that a rank shows (banner,
run.json, report) but must not work out again (DESIGN.md: decisions are made once, in launch).

The launcher puts one JSON document in ``MLM_LAUNCH``; the job reads it back. A job started without the launcher
(a bare ``torchrun -m train.run.job``) has none, and says so where it would show them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

HANDOFF_ENV = "MLM_LAUNCH"


def precision_name(fp16: bool, bf16: bool) -> str:
    """bf16, fp16 or fp32, from the TrainingArguments flags (bf16 wins when both are set, as in the Trainer)."""
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def global_batch(per_device: int, world_size: int, accumulation: int) -> int:
    """Samples per optimizer step across all ranks."""
    return int(per_device) * max(int(world_size or 1), 1) * int(accumulation)


def precision_label(name: str, tf32: bool) -> str:
    """How a precision is shown everywhere (plan summary, banner, run.json): ``bf16 + tf32``."""
    return name + (" + tf32" if tf32 else "")


@dataclass(frozen=True)
class Handoff:
    precision: str  # as shown: "bf16 + tf32"
    global_batch_size: int | None  # None when the node count is elastic
    batch: str  # the batch line of the plan: "batch: 32 per device x 8 GPUs x 2 nodes x 1 accumulation = 512 global"
    nnodes: str  # N, or min:max when elastic
    gpus: list[str] = field(default_factory=list)  # names of this node's GPUs, in CUDA order; empty on CPU
    gpu_uuids: list[str] = field(default_factory=list)  # the same devices by UUID (what the logs sample)
    command: list[str] = field(default_factory=list)  # the torchrun command that started the ranks (holds no secret)
    outputs_checked: bool = False  # this node's output location and cache were checked before the ranks started
    decided: list[str] = field(default_factory=list)  # the options the launcher's flags set (not the user's)
    deadline: float | None = None  # when the run must be over (seconds since the epoch): train/launch/deadline.py
    deadline_source: str = ""  # what set it, in words
    budget_s: float | None = None  # the time from the launch to the deadline
    launched_at: float | None = None  # when the launcher started (seconds since the epoch): quality against time
    gpu_memory_bytes: int | None = None  # the smallest of this node's GPUs (MLM_SHARDING=auto fits DDP into it)
    phase: dict[str, Any] | None = None  # a phased run's phase this launch trains (train/common/phase.py)

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @property
    def budgeted(self) -> bool:
        """Whether this launch runs to a deadline (a time budget, a Slurm job's limit): the one answer for the
        ranks' parts that plan by it (train/run/budget.py) or keep out of its way."""
        return self.deadline is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Handoff | None:
        raw = (os.environ if environ is None else environ).get(HANDOFF_ENV)
        if not raw:
            return None
        try:
            data: dict[str, Any] = json.loads(raw)
            return cls(**data)
        except (ValueError, TypeError):  # a stale or hand-written value: show nothing rather than wrong facts
            return None
