"""The rollback's rules (train/run/rollback.py): the checkpoint it goes back to, the window it skips, the bound,
and the checkpoints after its point moved aside; on checkpoints as the Trainer writes them (tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import checkpoint
from train.outputs.runfiles import RunFiles
from train.run.rollback import (
    DataSkip,
    Divergence,
    Rollbacks,
    rollback_point,
    rollback_unavailable,
    skipped_window,
)


@pytest.mark.parametrize(
    ("steps", "healthy", "point"),
    [([2, 4, 6], 7, 6), ([2, 4, 6], 6, 4), ([2, 4, 6], 5, 4), ([2, 4, 6], 2, None), ([], 9, None)],
)
def test_the_point_is_the_newest_checkpoint_before_the_last_healthy_log(
    steps: list[int], healthy: int, point: int | None
) -> None:
    assert rollback_point(steps, healthy) == point


def test_the_window_is_the_steps_after_the_checkpoint_to_the_detection() -> None:
    assert skipped_window(4, 9) == (5, 9)
    assert skipped_window(4, 5) == (5, 5)


def test_a_skip_draws_its_steps_batches_and_stops_at_the_epochs_end() -> None:
    batches = iter(range(10))
    skip = DataSkip(at=4, steps=3)
    assert skip.due(4) and not skip.due(5)
    assert skip.take(batches, per_step=2) == 3 and next(batches) == 6  # 6 batches dropped, the 7th is next
    assert skip.record["batches_skipped_per_rank"] == 6 and not skip.due(4)
    short = DataSkip(at=0, steps=3)
    assert short.take(iter(range(4)), per_step=2) == 2 and short.record["batches_skipped_per_rank"] == 4


def rollbacks(root: Path, limit: int = 3, unavailable: str = "") -> Rollbacks:
    return Rollbacks(limit, RunFiles(root), DataSkip(), unavailable=unavailable, lr_factor=0.5)


def test_a_rollback_goes_back_moves_the_later_checkpoints_aside_and_arms_its_skip(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        checkpoint(tmp_path, step)
    made = rollbacks(tmp_path)
    back = made.back_from(Divergence(step=7, kind="spike", what="loss 9 is ...", healthy=6), per_step=2)
    assert back == str(tmp_path / "checkpoint-4")
    assert [p.name for p in RunFiles(tmp_path).checkpoints()] == ["checkpoint-2", "checkpoint-4"]
    assert [p.name.rsplit("-", 1)[0] for p in tmp_path.glob(".invalid-*")] == [".invalid-checkpoint-6"]
    assert (made.skip.at, made.skip.steps, made.skip.lr_factor) == (4, 3, 0.5)
    [record] = made.record()["rollbacks"]
    assert record["rolled_back_to"] == "checkpoint-4" and record["skipped_steps"] == [5, 7]
    assert record["batches_skipped_per_rank"] == 6 and record["detected"] == "spike"
    assert record["learning_rate_factor"] == 0.5


def test_the_bound_ends_the_next_one_saying_what_was_tried(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        checkpoint(tmp_path, step)
    made = rollbacks(tmp_path, limit=2)
    assert made.back_from(Divergence(7, "spike", "x", 7), 1) == str(tmp_path / "checkpoint-6")
    assert made.back_from(Divergence(8, "non-finite", "y", 7), 1) == str(tmp_path / "checkpoint-6")
    assert made.back_from(Divergence(8, "non-finite", "y", 7), 1) is None
    assert made.refusal == (
        "after 2 rollbacks (step 7 to checkpoint-6, step 8 to checkpoint-6), the most spike_rollbacks allows"
    )
    assert made.record()["made"] == 2


def test_no_rollback_without_a_checkpoint_before_it_when_off_or_unavailable(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4)
    (checkpoint(tmp_path, 6) / "trainer_state.json").unlink()  # cut off while written: never rolled back to
    none = rollbacks(tmp_path)
    assert none.back_from(Divergence(9, "spike", "x", 4), 1) is None
    assert none.refusal == "no complete checkpoint before step 4 (the last healthy log) to roll back to"
    assert none.back_from(Divergence(9, "spike", "x", 7), 1) == str(tmp_path / "checkpoint-4")
    off = rollbacks(tmp_path, limit=0)
    assert off.back_from(Divergence(9, "spike", "x", 7), 1) is None and off.refusal == ""
    streamed = rollbacks(tmp_path, unavailable=rollback_unavailable(True, "ddp", None))
    assert streamed.back_from(Divergence(9, "spike", "x", 7), 1) is None
    assert streamed.refusal == "no rollback with a streamed corpus yet"
    assert rollback_unavailable(False, "ddp", None) == ""
    assert "fsdp" in rollback_unavailable(False, "fsdp", None) and "store" in rollback_unavailable(
        False, "ddp", "s3://b"
    )
