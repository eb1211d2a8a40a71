"""Which checkpoints a run keeps (train/outputs/retention.py): the newest save_total_limit complete ones, each
save_keep_every-th step, the protected; rotated once the newest is marked, never a checkpoint still being written."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl

from tests.helpers import checkpoint
from train.outputs.retention import Retention, rotate_directory
from train.outputs.runfiles import RunFiles
from train.run.callbacks import CheckpointCompleteMarker


@pytest.mark.parametrize(
    ("retention", "protect", "kept"),
    [
        (Retention(2), [], {40, 50}),
        (Retention(1, every=20), [], {20, 40, 50}),
        (Retention(2, every=20), [10], {10, 20, 40, 50}),  # the best model's too
        (Retention(None, every=20), [], {10, 20, 30, 40, 50}),  # no limit: every checkpoint
        (Retention(0), [], {10, 20, 30, 40, 50}),
    ],
)
def test_the_newest_each_nth_and_the_protected_are_kept(
    retention: Retention, protect: list[int], kept: set[int]
) -> None:
    steps = [30, 10, 50, 20, 40]
    assert retention.kept(steps, protect) == kept
    assert retention.removed(steps, protect) == sorted(set(steps) - kept)


def test_a_directory_keeps_what_the_rule_says_and_leaves_unmarked_checkpoints_alone(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "out")
    for step in (10, 20, 30, 40):
        checkpoint(files.root, step)
    being_written = checkpoint(files.root, 50, marked=False)  # no marker yet: its write is under way
    cut_off = checkpoint(files.root, 5, marked=False)  # a resume sets it aside; rotation leaves it
    assert rotate_directory(files, Retention(1, every=20)) == [10, 30]
    assert [p.name for p in files.checkpoints()] == ["checkpoint-5", "checkpoint-20", "checkpoint-40", "checkpoint-50"]
    assert being_written.exists() and cut_off.exists()


def test_the_marker_rotates_once_the_new_checkpoint_is_complete(tmp_path: Path) -> None:
    """A synchronous save: its marker, then the rotation, with the best model's checkpoint protected."""
    files = RunFiles(tmp_path / "out")
    for step in (10, 20, 30):
        checkpoint(files.root, step)
    checkpoint(files.root, 40, marked=False)  # the save of step 40, whole but not yet marked
    marker = CheckpointCompleteMarker(files, {"seed": 3}, retention=Retention(2))
    best = str(files.checkpoint(10))
    state = SimpleNamespace(global_step=40, is_world_process_zero=True, best_model_checkpoint=best)
    marker.on_save(SimpleNamespace(output_dir=str(files.root)), state, TrainerControl())
    assert [p.name for p in files.checkpoints()] == ["checkpoint-10", "checkpoint-30", "checkpoint-40"]
