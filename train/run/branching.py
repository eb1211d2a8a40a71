"""A branch's first start, on every rank: its resume from the branch point (train/outputs/branch.py) is allowed to
read other data than the parent's checkpoint records (said, not refused), and a learning rate the branch changes
reaches the restored schedule.

Why the learning rate needs us: the Trainer restores the scheduler's state with the checkpoint, and
``LambdaLR.load_state_dict`` puts back the parent's ``base_lrs``, the peaks the schedule multiplies; the branch's
own ``learning_rate`` would be ignored. :class:`BranchLearningRate` scales them by the branch's rate over the
parent's (train/borrowed/torch_optim.py ``scale_peaks``: torch has no public setter) at ``on_train_begin`` (the
Trainer calls it after loading the state), once, at the branch point only: the branch's own checkpoints save the
scaled peaks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from train.borrowed.torch_optim import scale_peaks
from train.common import distributed
from train.common.console import warn
from train.config import Config
from train.data.identity import changes
from train.outputs.branch import BranchPoint, is_branch_point
from train.outputs.checkpoints import DATA_IDENTITY, saved_options
from train.outputs.runfiles import RunFiles


def branch_start(config: Config, resume: str | None, identity: dict[str, Any]) -> BranchPoint | None:
    """The branch point when this run resumes from it (every rank alike), after saying on world rank 0 what data
    the branch reads that its parent did not; None for any other resume."""
    branch = is_branch_point(RunFiles(config.training.output_dir), resume)
    if branch is None or resume is None:
        return None
    changed, _ = changes(saved_options(Path(resume)).get(DATA_IDENTITY), identity)
    if changed and distributed.is_world_zero():
        warn(f"{branch.line()}: the branch reads other data than its parent did ({'; '.join(changed[:3])})")
    return branch


class BranchLearningRate(TrainerCallback):
    """At the branch point, the restored schedule's peaks scaled to the branch's learning rate (module docstring)."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        scheduler = kwargs.get("lr_scheduler")
        if scheduler is None or self.ratio == 1.0:
            return
        scale_peaks(scheduler, self.ratio)  # and the first step's rate
        self.ratio = 1.0  # once: a second train() call in the same process must not scale them again


def learning_rate_ratio(config: Config, branch: BranchPoint | None) -> float:
    """The branch's learning rate over its parent's (1.0 when not a branch point or the parent's is unknown)."""
    parent = branch.learning_rate if branch is not None else None
    if not parent:
        return 1.0
    return config.training.learning_rate / parent
