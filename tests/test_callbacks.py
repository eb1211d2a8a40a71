"""The callbacks' rules on the Trainer's own state objects: the divergence guard, the completeness marker and the
collator's epoch."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

from train.outputs.runfiles import COMPLETE_MARKER, OPTIONS_NAME, RunFiles
from train.run.callbacks import CheckpointCompleteMarker, DivergenceGuard, EpochForCollator, finite_weights


def state(step: int, epoch: float = 0.0, zero: bool = True) -> TrainerState:
    found = TrainerState(global_step=step, epoch=epoch)
    found.is_world_process_zero = zero
    return found


@pytest.mark.parametrize("key", ["loss", "grad_norm"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_log_stops_without_saving(key: str, value: float) -> None:
    guard, control = DivergenceGuard(), TrainerControl(should_save=True)
    guard.on_log(None, state(7), control, logs={key: value, "learning_rate": 1e-4})
    assert (guard.step, guard.what) == (7, f"{key} is {value}")
    assert control.should_training_stop and not control.should_save


def test_finite_logs_and_other_keys_leave_the_run_alone() -> None:
    guard, control = DivergenceGuard(), TrainerControl()
    guard.on_log(None, state(3), control, logs={"loss": 2.5, "grad_norm": 1.0, "eval_loss": math.nan})
    guard.on_log(None, state(4), control, logs=None)
    assert guard.step is None and not control.should_training_stop


def test_the_first_divergence_is_the_one_reported() -> None:
    guard, control = DivergenceGuard(), TrainerControl()
    guard.on_log(None, state(5), control, logs={"loss": math.nan})
    guard.on_log(None, state(6), control, logs={"grad_norm": math.inf})
    assert (guard.step, guard.what) == (5, "loss is nan")


def test_non_finite_weights_are_caught_before_a_save_only() -> None:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    assert not finite_weights(model)
    guard = DivergenceGuard()
    guard.on_step_end(None, state(9), TrainerControl(should_save=False), model=model)
    assert guard.step is None  # no save at this step: nothing to protect, no cost of a check
    control = TrainerControl(should_save=True)
    guard.on_step_end(None, state(10), control, model=model)
    assert (guard.step, guard.what) == (10, "the weights are not finite") and not control.should_save
    assert finite_weights(torch.nn.Linear(2, 2))


def test_the_marker_records_the_options_in_the_checkpoint_rank_0_saved(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    files.checkpoint(20).mkdir()
    args = SimpleNamespace(output_dir=str(tmp_path))
    CheckpointCompleteMarker(files, {"seed": 3}).on_save(args, state(20, zero=False), TrainerControl())
    assert not (files.checkpoint(20) / COMPLETE_MARKER).exists()  # another rank: rank 0 writes
    CheckpointCompleteMarker(files, {"seed": 3}).on_save(args, state(20), TrainerControl())
    assert (files.checkpoint(20) / COMPLETE_MARKER).read_text().strip()
    assert json.loads((files.checkpoint(20) / OPTIONS_NAME).read_text()) == {"seed": 3}
    CheckpointCompleteMarker(files, {}).on_save(args, state(30), TrainerControl())  # no such checkpoint: nothing made
    assert not files.checkpoint(30).exists()


def test_each_save_records_its_size_and_what_the_save_and_the_digests_took(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    files.checkpoint(20).mkdir()
    (files.checkpoint(20) / "model.safetensors").write_bytes(b"w" * 2**20)
    marker = CheckpointCompleteMarker(files, {"seed": 3})
    marker.on_step_end(None, state(20), TrainerControl())
    time.sleep(0.05)  # the Trainer writing the checkpoint
    marker.on_save(SimpleNamespace(output_dir=str(tmp_path)), state(20), TrainerControl())
    (record,) = [json.loads(line) for line in files.train_jsonl.read_text().splitlines()]
    assert (record["event"], record["step"], record["files"], record["mib"]) == ("checkpoint", 20, 2, 1.0)
    assert record["save_s"] >= 0.05 and 0 <= record["digest_s"] < record["save_s"]
    # synchronous (no background writer): the loop waited for all of it, nothing was written behind it
    assert record["save_background_s"] == 0 and record["save_blocking_s"] >= record["save_s"]


def test_the_collator_learns_the_epoch_before_its_loader_starts() -> None:
    collator = SimpleNamespace(epoch=0)
    EpochForCollator(collator).on_epoch_begin(None, state(0, epoch=2.0), TrainerControl())  # type: ignore[arg-type]
    assert collator.epoch == 2
