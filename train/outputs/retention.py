"""Which checkpoints a run keeps: the newest ``save_total_limit`` complete ones, each one whose step is a multiple of
``save_keep_every`` (a training trajectory kept for analysis), and those protected (the best model's); the other
complete ones are removed, oldest first, once the newest is marked complete. One rule for a directory (a staging
directory too) and for a bucket (train/outputs/store.py rotate).

What the Trainer lacks: its rotation (transformers 5.25, ``trainer_utils.rotate_checkpoints``) keeps the newest N
and the best model's, nothing by step, and runs inside its save, before the new checkpoint's marker: it would delete
the newest complete checkpoint while the next one was still being written. The job hands the Trainer no
``save_total_limit`` (train/run/build.py trainer_arguments) and rotates here, after each marker: in the save's own
thread, the training loop's or the background writer's (train/run/callbacks.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass

from train.outputs.marker import listed_files
from train.outputs.runfiles import RunFiles, step_of


@dataclass(frozen=True)
class Retention:
    """The run's rule: ``newest`` (save_total_limit: 0 or None keeps every checkpoint) and ``every`` (save_keep_every:
    0 keeps none by step)."""

    newest: int | None
    every: int = 0

    def kept(self, steps: Iterable[int], protect: Iterable[int] = ()) -> set[int]:
        """Of the complete checkpoints' ``steps``, those kept."""
        ordered = sorted(set(steps), reverse=True)
        if not self.newest:
            return set(ordered)
        by_step = {step for step in ordered if self.every and step % self.every == 0}
        return set(ordered[: self.newest]) | by_step | set(protect)

    def removed(self, steps: Iterable[int], protect: Iterable[int] = ()) -> list[int]:
        """Of the complete checkpoints' ``steps``, those to remove, oldest first."""
        present = set(steps)
        return sorted(present - self.kept(present, protect))


def rotate_directory(files: RunFiles, retention: Retention, protect: Iterable[int] = ()) -> list[int]:
    """The rule on the checkpoints in ``files`` (world rank 0, once the newest is marked complete): a checkpoint
    without its ``.complete`` marker is left as it is (one being written, or one a resume sets aside), and so is a
    link. The removed steps."""
    complete = [
        step_of(path) for path in files.checkpoints() if not path.is_symlink() and listed_files(path) is not None
    ]
    removed = retention.removed(complete, protect)
    for step in removed:
        shutil.rmtree(files.checkpoint(step), ignore_errors=True)
    return removed
