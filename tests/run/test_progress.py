"""A rank's progress record (train/run/progress.py) as its launcher's hang watchdog reads it: each event of
progress, what follows a step (a save is busy, an evaluation is not), the longest gap, and the end."""

from __future__ import annotations

import faulthandler
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from train.common.progress import STACK_SIGNAL, read_progress
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
    state, control = SimpleNamespace(global_step=4), SimpleNamespace(should_save=False, should_evaluate=False)
    report.on_step_begin(None, state, control)
    assert (last(directory).where, last(directory).began, last(directory).busy) == ("training step 5", True, False)
    state.global_step = 5
    control.should_save = True
    report.on_step_end(None, state, control)
    assert (last(directory).where, last(directory).busy) == ("saving a checkpoint after step 5", True)
    report.on_save(None, state, control)
    assert (last(directory).where, last(directory).busy) == ("saved a checkpoint at step 5", False)
    control.should_save, control.should_evaluate = False, True
    report.on_step_end(None, state, control)
    assert last(directory).where == "evaluating after step 5"
    report.on_train_end(None, state, control)
    control.should_evaluate = False
    report.on_prediction_step(None, state, control)  # the final evaluation's batches are progress again
    assert not last(directory).busy
    report.on_evaluate(None, state, control)  # then the final model is saved and published: busy
    assert (last(directory).where, last(directory).busy) == ("ending after step 5", True)
    assert last(directory).pid > 0 and last(directory).rank == 0


def test_the_longest_gap_leaves_out_busy_stretches(reported: Any) -> None:
    report, directory = reported
    report.report(1, "training step 2", began=True)
    time.sleep(0.3)
    report.report(1, "finished step 1")
    report.report(1, "saving a checkpoint after step 1", busy=True)
    time.sleep(0.6)  # a save: the collective timeout's, not a gap
    report.report(1, "saved a checkpoint at step 1")
    assert 0.3 <= last(directory).gap_s < 0.6


def test_no_report_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress_report({}) is None
