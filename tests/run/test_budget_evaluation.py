"""A time budget's evaluations sized to it (train/run/budget_evaluation.py): at the first plan, a held-out set whose
evaluation would take more than a tenth of the budget is cut to its first examples that fit, for every evaluation
of the run; a mixture's parts by the same share; one that fits is left whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import TrainerState, get_scheduler

from tests.run.test_budget import Clock, arguments, budget_handoff, first_plan
from train.data.tokenization import IndexedExamples
from train.run import budget as budget_module
from train.run.budget import FORWARD_SHARE, TimeBudget
from train.run.budget_evaluation import EVALUATION_SHARE, EvaluationSizer, batches_that_fit
from train.run.trainer import MLMTrainer


class HeldOut(SimpleNamespace):
    """The trainer's held-out sets (``eval_dataset``, a mixture's ``eval_parts``), cut by MLMTrainer's own rule."""

    limit_evaluation = MLMTrainer.limit_evaluation


def held_out(count: int, first: int = 0) -> IndexedExamples:
    return IndexedExamples(Dataset.from_dict({"input_ids": [[first + i, 1, 2] for i in range(count)]}))


def test_the_batches_that_fit_a_tenth_of_the_budget() -> None:
    assert EVALUATION_SHARE == 0.1
    assert batches_that_fit(150.0, batches=1_000, batch_s=0.15) == 100  # 15 s of the 150
    assert batches_that_fit(150.0, batches=50, batch_s=0.15) == 50  # 7.5 s: all of it
    assert batches_that_fit(1.0, batches=50, batch_s=10.0) == 1  # one batch at least


def run_to_first_plan(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, trainer: Any, batches: int) -> TimeBudget:
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    callback = TimeBudget(budget_handoff(clock.now, 150, "150s"), eval_batches=batches, checkpoint_mb=20.0)
    callback.size_evaluation = EvaluationSizer(trainer)
    args = arguments(tmp_path, max_steps=10_000, eval_strategy="steps", eval_steps=50)
    state = TrainerState()
    state.max_steps = 10_000
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first_plan(callback, args, state, clock, get_scheduler("linear", optimizer, 0, 10_000))
    return callback


def test_a_held_out_set_too_large_for_the_budget_is_cut_once_at_the_first_plan(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Steps of 0.5 s: a batch's forward pass is estimated at a third of that; 15 s (a tenth of 150) fit 90 batches."""
    trainer = HeldOut(eval_dataset=held_out(2_000), eval_parts=None)
    callback = run_to_first_plan(tmp_path, monkeypatch, trainer, batches=500)
    kept = int(EVALUATION_SHARE * 150 / (0.5 * FORWARD_SHARE))
    assert callback.eval_batches == kept == 90 and len(trainer.eval_dataset) == kept * 4
    assert trainer.eval_dataset[0]["sample_index"] == 0  # the first examples, with the positions their masks key on
    assert callback.plan.plans[0]["evaluation_s"] == pytest.approx(kept * 0.5 * FORWARD_SHARE)  # planned with it
    assert "each evaluation reads the first 360 of the 2,000 held-out examples" in capsys.readouterr().err


def test_a_mixtures_parts_are_cut_by_the_same_share_and_a_set_that_fits_stays_whole(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = {"news": held_out(1_500), "legal": held_out(500, 10_000)}
    trainer = HeldOut(eval_dataset=held_out(2_000), eval_parts=parts)
    run_to_first_plan(tmp_path, monkeypatch, trainer, batches=500)
    assert {k: len(v) for k, v in trainer.eval_parts.items()} == {"news": 270, "legal": 90}
    assert len(trainer.eval_dataset) == 360 and trainer.eval_dataset[270]["input_ids"][0] == 10_000

    small = HeldOut(eval_dataset=held_out(200), eval_parts=None)
    callback = run_to_first_plan(tmp_path, monkeypatch, small, batches=50)
    assert callback.eval_batches == 50 and len(small.eval_dataset) == 200
