"""A diverged or spiking run rolled back: the newest complete checkpoint before the spike chosen (world rank 0, the
others told), the checkpoints after it moved aside, the batches that led into the spike skipped, and the bound. The
job's ``train`` (train/run/job.py) trains again from the chosen checkpoint through the Trainer's own resume
(``resume_from_checkpoint``), the path every resume takes; the divergence guard (train/run/callbacks.py) decides
when.

The checkpoint is the newest complete one before the last healthy log's step (:func:`rollback_point`). Which batches are
skipped: those of the steps after it up to the step the spike was detected at (the spike lies after the last healthy
log; the whole window is left out, as PaLM skipped a few hundred batches before each spike). The Trainer skips the
batches its checkpoint trained on as it always does, and ``MLMTrainer.get_batch_samples`` then draws the window's
batches from the epoch's loader and drops them (:class:`DataSkip`), on every rank alike: the run goes on with the
batches after the window, in the same order it would have read them. The skipped steps count as taken (the step number
and the learning rate's schedule move past them, the weights do not): a step's number stays the place of its batches in
the data, so that a later resume - a restart's, another rollback's - skips to the right batch, and the run still ends at
its planned step. A window that reaches past its epoch's end is skipped to that end only (the next epoch's order is its
own)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from train.common import distributed
from train.common.console import now, say
from train.common.rollbacks import RollbackRecord
from train.outputs.checkpoints import problem
from train.outputs.runfiles import RunFiles, step_of
from train.run.saving import CheckpointWriter


@dataclass
class DataSkip:
    """The batches a rollback leaves out: ``steps`` optimizer steps' worth, skipped when the Trainer's loop starts
    again at step ``at`` (None: nothing to skip). ``record``: the rollback's run.json entry, told how many this
    rank skipped."""

    at: int | None = None
    steps: int = 0
    record: dict[str, Any] = field(default_factory=dict)
    lr_factor: float = 1.0  # the schedule's peaks multiplied by it as the training starts again (spike_lr_factor)

    def due(self, step: int) -> bool:
        return self.at is not None and self.at == step

    def take(self, batches: Iterator[Any], per_step: int) -> int:
        """Draw and drop the window's batches from ``batches`` (``per_step`` each step: the gradient
        accumulation); how many steps' worth there were (fewer at an epoch's end), which the Trainer counts as
        taken."""
        taken = 0
        for _ in range(self.steps * per_step):
            try:
                next(batches)
            except StopIteration:
                break
            taken += 1
        self.record["batches_skipped_per_rank"] = taken
        self.at = None
        return taken // per_step


def rollback_unavailable(streaming: bool, sharding: str, store: str | None) -> str:
    """Why this run cannot roll back (words after "no rollback"), or "" where it can. Not yet: a stream's position
    is restored only at a start (train/run/trainer_settings.py resumed_stream), fsdp's state through DCP is untried
    here, and a store's copies of the checkpoints after the rollback's point would stay there to be resumed."""
    if streaming:
        return "with a streamed corpus yet"
    if sharding == "fsdp":
        return "under sharding fsdp yet"
    if store is not None:
        return "with output_dir in a store yet"
    return ""


def rollback_point(steps: Sequence[int], healthy: int) -> int | None:
    """The step a rollback goes back to: the newest of the usable checkpoints' ``steps`` before ``healthy``, the
    last step whose log was healthy, else None. Before it, not at it: a step's log judges the loss and gradient
    of weights updated up to the step before (the weights a checkpoint of that step holds include its own update,
    which only the next log judges)."""
    before = [s for s in steps if s < healthy]
    return max(before) if before else None


def skipped_window(checkpoint: int, detected: int) -> tuple[int, int]:
    """The steps whose batches are skipped: the first after the checkpoint to the one the spike was detected at."""
    return checkpoint + 1, detected


@dataclass
class Divergence:
    """What the guard saw: at ``step`` (the step it was detected at), ``kind`` (non-finite or spike), in ``what``
    words; ``healthy``: the last step whose log was judged healthy (0: none)."""

    step: int
    kind: str
    what: str
    healthy: int


@dataclass
class Rollbacks:
    """The rollbacks a run makes, at most ``limit`` (spike_rollbacks; 0: none, a divergence ends the run as it
    always did); ``unavailable``: why this run cannot roll back (a stream, sharding), said when it would have."""

    limit: int
    files: RunFiles
    skip: DataSkip
    saves: CheckpointWriter | None = None
    unavailable: str = ""
    lr_factor: float = 1.0  # spike_lr_factor
    done: list[dict[str, Any]] = field(default_factory=list)
    refusal: str = ""  # why the last divergence was not rolled back, for the run's last line

    def back_from(self, seen: Divergence, per_step: int) -> str | None:
        """The checkpoint to train again from after ``seen`` (every rank the same), with its window armed for
        :class:`DataSkip` and the checkpoints after it moved aside; None where none is made (``refusal`` says
        why, empty where rollback is off)."""
        if self.limit == 0:
            return None
        if self.unavailable:
            self.refusal = f"no rollback {self.unavailable}"
            return None
        if len(self.done) >= self.limit:
            tried = ", ".join(f"step {r['detected_at_step']} to {r['rolled_back_to']}" for r in self.done)
            self.refusal = f"after {len(self.done)} rollbacks ({tried}), the most spike_rollbacks allows"
            return None
        if self.saves is not None:  # a checkpoint written in the background is whole before one is chosen
            self.saves.wait()
        step = self.agreed_point(seen.healthy)
        if step is None:
            healthy = f"step {seen.healthy} (the last healthy log)" if seen.healthy else "a healthy log"
            self.refusal = f"no complete checkpoint before {healthy} to roll back to"
            return None
        if self.saves is not None:
            self.saves.rewind(step)
        first, last = skipped_window(step, seen.step)
        record = RollbackRecord(
            time=now(), detected_at_step=seen.step, detected=seen.kind, what=seen.what,
            rolled_back_to=self.files.checkpoint(step).name, skipped_steps=(first, last),
            batches_skipped_per_rank=(last - first + 1) * per_step, learning_rate_factor=self.lr_factor,
        ).record()  # fmt: skip
        self.done.append(record)
        self.skip.at, self.skip.steps, self.skip.record = step, last - first + 1, record
        self.skip.lr_factor = self.lr_factor
        if distributed.is_world_zero():
            say(
                f"rollback {len(self.done)} of at most {self.limit}: {seen.what} at step {seen.step}; training again "
                f"from {record['rolled_back_to']}, the batches of steps {first}-{last} skipped"
                + (f", the peak learning rate times {self.lr_factor:g}" if self.lr_factor != 1.0 else ""),
                "warning",
            )
        return str(self.files.checkpoint(step))

    def agreed_point(self, healthy: int) -> int | None:
        """World rank 0 chooses the checkpoint and moves the later ones aside; every rank gets its step."""
        choice: list[int | None] = [None]
        if distributed.is_world_zero():
            # newest first, each verified only when it is the candidate (a checkpoint's digests read it whole)
            steps = [step_of(c) for c in self.files.checkpoints()]
            point = rollback_point(steps, healthy)
            while point is not None and problem(self.files.checkpoint(point)) is not None:
                steps.remove(point)
                point = rollback_point(steps, healthy)
            choice = [point]
            if point is not None:
                self.move_aside_after(point)
        if distributed.initialized():
            dist.broadcast_object_list(choice, src=0)
        distributed.barrier()
        return choice[0]

    def move_aside_after(self, step: int) -> None:
        """The checkpoints after ``step`` moved aside (train/outputs/runfiles.py's aside names: kept for a look,
        removed by a later start's rotation of them), so that the steps trained again save afresh and the
        rotation never keeps a checkpoint of the abandoned steps over the one rolled back to."""
        for checkpoint in self.files.checkpoints():
            if step_of(checkpoint) > step:
                aside = self.files.aside(checkpoint, os.getpid())
                os.replace(checkpoint, aside)
                say(f"rollback: {checkpoint.name}, written after the step rolled back to, moved to {aside.name}")

    def record(self) -> dict[str, Any]:
        """run.json's ``rollbacks``."""
        return {"limit": self.limit, "made": len(self.done), "rollbacks": self.done}
