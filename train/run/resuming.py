"""Where a rank starts: the checkpoint the job agreed on, read against this launch (a branch's or a phase's first
start, whose other data and batch options are by design; a phase resumed from an earlier phase's checkpoint,
refused), the data it was saved on (changed data refused unless asked for), the global batch kept on another world
size, and the sharding mode it was written in. The rank's preparation (train/run/build.py) calls
:func:`resume_point` once the data is read and before the tokenizer: a resumed run tokenizes with its
checkpoint's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from train.common import distributed
from train.common.console import say, warn
from train.common.errors import ConfigError
from train.common.phase import PhaseFacts
from train.config import CheckpointArguments, Config, env_name
from train.data.identity import changes
from train.outputs.branch import BranchPoint, is_branch_point
from train.outputs.checkpoints import DATA_IDENTITY, kept_global_batch, saved_options
from train.outputs.runfiles import RunFiles, step_of
from train.run.branching import phase_of_launch, phase_starts, say_other_data
from train.run.sharding import resumed_mode


@dataclass(frozen=True)
class ResumePoint:
    """Where this rank starts, and on what terms."""

    resume: str | None  # the checkpoint it resumes from (its node's copy); None: from the start
    recorded_branch: BranchPoint | None  # where the run branched from, when it is a branch (branch.json)
    branch: BranchPoint | None  # that branch point when this is the branch's first start, else None
    phase: PhaseFacts | None  # the phase this launch trains, in a phased run (train/launch/phases.py)
    data_changed: list[str] | None  # what changed in the data since the checkpoint, when told to go on anyway


def resume_point(config: Config, files: RunFiles, resume: str | None, identity: dict[str, Any]) -> ResumePoint:
    """``resume`` read against this launch and the data as read (``identity``), before anything is tokenized: what
    it refuses raises ConfigError. It takes the whole Config because it holds the checkpoint against every
    section the checkpoint recorded (the data, the batch, the sharding mode)."""
    recorded = BranchPoint.read(files)
    branch, phase = is_branch_point(recorded, resume), phase_of_launch()
    # A branch's or a phase's first start: other data and batch options than the checkpoint's, by design.
    by_design = branch.line() if branch else phase.line() if phase and phase_starts(resume, phase) else None
    resumed_step = step_of(Path(resume)) if resume else 0
    if phase is not None and resumed_step < phase.start:
        # The newest checkpoint, which the launcher started this phase by, was set aside as unusable: the one left
        # is an earlier phase's, whose options are not this launch's.
        raise ConfigError(
            f"{phase.line()}: the checkpoint to resume from is at step {resumed_step}, before this phase (a newer "
            "one was set aside as unusable); run the same command again: the phase it belongs to resumes from it"
        )
    data_changed = None
    if resume:
        if by_design:
            say_other_data(resume, identity, by_design)
        else:
            data_changed = resumed_data(config.checkpoint, Path(resume), identity)  # refused unless asked for
            keep_the_global_batch(config.training, config.sources, Path(resume))
        resumed_mode(config.launch, Path(resume))  # a mode set against the checkpoint's own: refused before tokenizing
    return ResumePoint(resume, recorded, branch, phase, data_changed)


def resumed_data(options: CheckpointArguments, checkpoint: Path, identity: dict[str, Any]) -> list[str] | None:
    """What changed in the data since ``checkpoint`` was saved (train/data/identity.py): refused (ConfigError) unless
    MLM_RESUME_ON_CHANGED_DATA, then said and returned for run.json and the card; None when nothing changed."""
    changed, notes = changes(saved_options(checkpoint).get(DATA_IDENTITY), identity)
    if distributed.is_world_zero():
        for note in notes:
            warn(f"resuming from {checkpoint.name}: {note}")
    if not changed:
        return None
    option = options.source_of("resume_on_changed_data")
    said = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
    if not options.resume_on_changed_data:
        raise ConfigError(
            f"{checkpoint.name} was saved while training on other data ({said}); the resume is refused: restore the "
            f"data, start over in another output_dir, or set {env_name('resume_on_changed_data')}=true to resume "
            "on the data as it is now"
        )
    if distributed.is_world_zero():
        warn(f"{option}=true: resuming from {checkpoint.name} on changed data ({said}); run.json and the card say so")
    return changed


def keep_the_global_batch(training: TrainingArguments, sources: Mapping[str, str], checkpoint: Path) -> None:
    """Resumed on another world size, the run keeps the checkpoint's global batch by its gradient accumulation
    (train/outputs/checkpoints.py kept_global_batch), before the Trainer reads it; every rank alike, rank 0 says so.
    ``sources``: where the options were set (an accumulation the user set is kept, and said)."""
    kept = kept_global_batch(training, sources, checkpoint)
    if kept is None:
        return
    accumulation, line = kept
    if accumulation is not None:
        training.gradient_accumulation_steps = accumulation
    if distributed.is_world_zero():
        (say if accumulation is not None else warn)(line)
