"""A rank's progress record (train/run/progress.py) as its launcher's hang watchdog reads it: each event of
progress, what follows a step (a save is busy, an evaluation is not), the longest gap and save, and the end."""

from __future__ import annotations

import faulthandler
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers import TrainerControl

from train.common.progress import ENDING, IDLE, SAVING, STACK_SIGNAL, read_progress
from train.outputs.runfiles import RunFiles
from train.run.callbacks import CheckpointCompleteMarker
from train.run.progress import ProgressReport, progress_report


@pytest.fixture
def reported(tmp_path: Path) -> Any:
    report = ProgressReport(str(tmp_path))
    yield report, tmp_path
    faulthandler.unregister(STACK_SIGNAL)
    report.stacks.close()


def last(directory: Path) -> Any:
    (progress,) = read_progress(directory)
    return progress


def test_each_event_is_recorded_with_where_the_rank_stands(reported: Any) -> None:
    report, directory = reported
    state, control = (
        SimpleNamespace(global_step=4),
        SimpleNamespace(should_save=False, should_evaluate=False, should_log=False),
    )
    report.on_step_begin(None, state, control)
    assert (last(directory).where, last(directory).began, last(directory).busy) == ("training step 5", True, IDLE)
    state.global_step = 5
    control.should_save = control.should_log = True
    report.on_step_end(None, state, control)  # the step's log first: its loss is gathered across ranks
    assert (last(directory).where, last(directory).busy) == ("finished step 5", IDLE)
    control.should_log = False
    report.on_log(None, state, control)
    assert (last(directory).where, last(directory).busy) == ("saving a checkpoint after step 5", SAVING)
    report.on_save(None, state, control)
    assert (last(directory).where, last(directory).busy) == ("saved a checkpoint at step 5", IDLE)
    control.should_save, control.should_evaluate = False, True
    report.on_step_end(None, state, control)
    assert last(directory).where == "evaluating after step 5"
    report.on_train_end(None, state, control)
    control.should_evaluate = False
    report.on_prediction_step(None, state, control)  # the final evaluation's batches are progress again
    assert not last(directory).busy
    report.on_evaluate(None, state, control)  # then the final model is saved and published: busy
    assert (last(directory).where, last(directory).busy) == ("ending after step 5", ENDING)
    assert last(directory).pid > 0 and last(directory).rank == 0


def test_the_longest_gap_leaves_out_saves_which_have_their_own(reported: Any) -> None:
    report, directory = reported
    report.report(1, "training step 2", began=True)
    time.sleep(0.3)
    report.report(1, "finished step 1")
    report.report(1, "saving a checkpoint after step 1", busy=SAVING)
    assert last(directory).save_s == 0  # no save has ended yet: its bound is the collective timeout
    time.sleep(0.6)  # a save: its own bound, not a gap
    report.report(1, "saved a checkpoint at step 1")
    assert 0.3 <= last(directory).gap_s < 0.6 and last(directory).save_s >= 0.6


def test_no_report_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress_report({}) is None


def test_a_save_ends_where_the_rank_waits_for_the_others_files(reported: Any, tmp_path: Path) -> None:
    """The marker tells the report before it gathers the ranks' digests (a collective): from there this rank waits
    for the others under the hang bound (what its own save took bounds its next), then saves on."""
    report, directory = reported
    files = RunFiles(tmp_path / "out")
    files.checkpoint(5).mkdir(parents=True)
    marker = CheckpointCompleteMarker(files, {"seed": 3}, progress=report)
    state = SimpleNamespace(global_step=5, is_world_process_zero=True, best_model_checkpoint=None)
    control = TrainerControl(should_save=True)
    report.on_step_end(None, state, control)
    time.sleep(0.2)  # the Trainer writing this rank's files
    marker.on_save(SimpleNamespace(output_dir=str(files.root)), state, control)
    saving = last(directory)  # saving again (the marker, the rotation), once the others' digests came
    assert (saving.where, saving.busy) == ("saving a checkpoint after step 5", SAVING)
    assert saving.save_s >= 0.2 and saving.gap_s < 0.2  # its files took 0.2 s: its own save, ended at the wait
