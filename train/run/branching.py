"""A resume from a checkpoint saved under other options by design, on every rank: a branch's first start (from its
branch point: train/outputs/branch.py) and a phase's first (from the previous phase's last checkpoint:
train/launch/phases.py). Either may read other data than the checkpoint records (said, not refused) and keeps its
own batch options; a learning rate a branch changes reaches the restored schedule.

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
from train.common.handoff import Handoff
from train.common.phase import PhaseFacts
from train.data.identity import changes
from train.outputs.branch import BranchPoint
from train.outputs.checkpoints import DATA_IDENTITY, saved_options

PHASE_KEY = "phase"  # a phased run's checkpoints record their phase's index among their options


def phase_starts(resume: str | None, phase: PhaseFacts | None) -> bool:
    """This launch starts its phase: it resumes from a checkpoint of another phase (the previous one's last)."""
    return bool(resume) and phase is not None and saved_options(Path(str(resume))).get(PHASE_KEY) != phase.index


def say_other_data(resume: str, identity: dict[str, Any], why: str) -> None:
    """World rank 0 says what data this run reads that ``resume`` was not saved on (by design: ``why``)."""
    changed, _ = changes(saved_options(Path(resume)).get(DATA_IDENTITY), identity)
    if changed and distributed.is_world_zero():
        warn(f"{why}: other data than the checkpoint's ({'; '.join(changed[:3])})")


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


def learning_rate_ratio(learning_rate: float, branch: BranchPoint | None) -> float:
    """The branch's ``learning_rate`` over its parent's (1.0 when not a branch point or the parent's is unknown)."""
    parent = branch.learning_rate if branch is not None else None
    if not parent:
        return 1.0
    return learning_rate / parent


def phase_of_launch() -> PhaseFacts | None:
    """The phase this launch trains, as the launcher handed it over (None: a run without phases)."""
    handoff = Handoff.from_environ()
    return PhaseFacts.from_record(handoff.phase) if handoff is not None else None


class PhaseEnd(TrainerCallback):
    """A phase that is not the last saves a checkpoint at its last step, whatever save_steps says: the next phase
    starts from it (train/launch/phases.py)."""

    def __init__(self, phase: PhaseFacts) -> None:
        self.phase = phase

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.phase.last and state.global_step == self.phase.end:
            control.should_save = True
