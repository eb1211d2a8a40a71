"""A time budget's evaluations sized to it (train/run/budget_evaluation.py): at the first plan, one evaluation batch
is measured through the path an evaluation takes, and a held-out set whose evaluation would take more than a tenth of
the budget at that pace is cut to its first examples that fit, for every evaluation of the run; a mixture's parts by
the same share; one that fits is left whole. Each evaluation says what it read and its loss's standard error."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import DistilBertConfig, DistilBertForMaskedLM, TrainerState, TrainingArguments, get_scheduler

from tests.helpers import trainer_settings
from tests.run.test_budget import Clock, arguments, budget_handoff, drive, first_plan
from train.data.tokenization import IndexedExamples
from train.model.collator import MaskingCollator
from train.run import budget as budget_module
from train.run import budget_evaluation
from train.run.batches import LOSS_SE, argmax_logits, evaluation_metrics, loss_standard_error, merged_figure
from train.run.budget import TimeBudget
from train.run.budget_evaluation import EVALUATION_SHARE, EvaluationSizer, batches_that_fit, evaluation_batch_seconds
from train.run.trainer import MLMTrainer


class HeldOut(SimpleNamespace):
    """The trainer as the sizer sees it: its held-out sets (``eval_dataset``, a mixture's ``eval_parts``, cut by
    MLMTrainer's own rule) and an evaluation loader of two batches that take ``batch_s`` each on the test's
    ``clock`` (or ``times``: one for each batch of a loader of that many)."""

    limit_evaluation = MLMTrainer.limit_evaluation

    def __init__(
        self, eval_dataset: Any, eval_parts: Any = None, batch_s: float = 0.1, times: list[float] | None = None
    ) -> None:
        super().__init__(
            eval_dataset=eval_dataset,
            eval_parts=eval_parts,
            times=times or [batch_s] * 2,
            clock=Clock(),
            model=torch.nn.Linear(1, 1),
            args=SimpleNamespace(dataloader_persistent_workers=False, prediction_loss_only=False),
            compute_metrics=None,
            steps=[],  # each prediction step: (the model in train mode?, the batch)
        )

    def get_eval_dataloader(self) -> list[dict[str, int]]:
        return [{"batch": index} for index in range(len(self.times))]

    def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool) -> tuple[Any, None, None]:
        self.steps.append((model.training, inputs["batch"]))
        self.clock.now += self.times[inputs["batch"]]
        return torch.tensor(1.0), None, None


def held_out(count: int, first: int = 0) -> IndexedExamples:
    return IndexedExamples(Dataset.from_dict({"input_ids": [[first + i, 1, 2] for i in range(count)]}))


def test_the_batches_that_fit_a_tenth_of_the_budget() -> None:
    assert EVALUATION_SHARE == 0.1
    assert batches_that_fit(150.0, batches=1_000, batch_s=0.15) == 100  # 15 s of the 150
    assert batches_that_fit(150.0, batches=50, batch_s=0.15) == 50  # 7.5 s: all of it
    assert batches_that_fit(1.0, batches=50, batch_s=10.0) == 1  # one batch at least


def test_an_evaluation_batch_is_the_median_of_three_timed_after_one_that_warms_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow first batch (the workers' start) is left out; of the next three, one that waited for a busy core
    (3 s) counts no more than a lucky short one (0.1 s): the median, 0.2 s. One timed batch would say 0.1 s, the
    shorter of two 0.1 s, their mean 1.1 s."""
    assert budget_evaluation.TIMED_BATCHES == 3
    trainer = HeldOut(held_out(100), times=[5.0, 0.1, 3.0, 0.2, 9.0])
    monkeypatch.setattr(budget_evaluation, "time", trainer.clock)
    assert evaluation_batch_seconds(trainer) == pytest.approx(0.2)
    assert [batch for _, batch in trainer.steps] == [0, 1, 2, 3]  # the fifth batch is not read


def run_to_first_plan(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, trainer: HeldOut, batches: int) -> TimeBudget:
    """A 150 s budget's run, evaluating every 50 steps, begun and planned on steps of 0.5 s; ``trainer``'s evaluation
    batch measured on the same clock."""
    clock = trainer.clock
    monkeypatch.setattr(budget_module, "time", clock)
    monkeypatch.setattr(budget_evaluation, "time", clock)
    callback = TimeBudget(budget_handoff(clock.now, 150, "150s"), eval_batches=batches, checkpoint_mb=20.0)
    callback.size_evaluation = EvaluationSizer(trainer)
    args = arguments(tmp_path, max_steps=10_000, eval_strategy="steps", eval_steps=50)
    state = TrainerState()
    state.max_steps = 10_000
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    tools = first_plan(callback, args, state, clock, get_scheduler("linear", optimizer, 0, 10_000))
    drive(callback, args, state, clock, 0.5, **tools)  # a step after the plan: its own time, not the measuring's
    return callback


def test_an_evaluation_batch_far_slower_than_a_step_gets_the_held_out_set_cut(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A dense head's evaluation: a batch measured at 1.5 s beside 0.5 s steps (a third of a step, the old estimate,
    would have kept all 50 batches: 8 s). 15 s (a tenth of 150) fit 10 batches; the plan counts them at 1.5 s."""
    trainer = HeldOut(held_out(200), batch_s=1.5)
    callback = run_to_first_plan(tmp_path, monkeypatch, trainer, batches=50)
    # one batch to warm up, three timed (a loader of two times its last again), in eval mode
    assert trainer.steps == [(False, 0), (False, 1), (False, 1), (False, 1)]
    assert trainer.model.training  # and back in train mode after
    assert callback.eval_batches == 10 and len(trainer.eval_dataset) == 40
    assert trainer.eval_dataset[0]["sample_index"] == 0  # the first examples, with the positions their masks key on
    plan = callback.plan.plans[0]
    assert plan["evaluation_batch_s"] == 1.5 and plan["evaluation_s"] == pytest.approx(10 * 1.5)  # planned with it
    assert callback.step_times[-1] == 0.5  # the measuring's 6 s are no step's
    said = capsys.readouterr().err
    assert "each evaluation reads the first 40 of the 200 held-out examples" in said
    assert "50 batches of 1.5 s, measured" in said


def test_an_evaluation_batch_far_faster_than_a_step_keeps_the_whole_set(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked-only head's evaluation: 500 batches of 0.01 s fit the tenth (a third of a 0.5 s step each, the old
    estimate, would have cut them to 90)."""
    trainer = HeldOut(held_out(2_000), batch_s=0.01)
    callback = run_to_first_plan(tmp_path, monkeypatch, trainer, batches=500)
    assert callback.eval_batches == 500 and len(trainer.eval_dataset) == 2_000
    assert callback.plan.plans[0]["evaluation_s"] == pytest.approx(500 * 0.01)


def test_a_mixtures_parts_are_cut_by_the_same_share_and_a_set_that_fits_stays_whole(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = {"news": held_out(1_500), "legal": held_out(500, 10_000)}
    trainer = HeldOut(held_out(2_000), parts, batch_s=0.125)  # 15 s fit 120 of the 500 batches
    run_to_first_plan(tmp_path, monkeypatch, trainer, batches=500)
    assert {k: len(v) for k, v in trainer.eval_parts.items()} == {"news": 360, "legal": 120}
    assert len(trainer.eval_dataset) == 480 and trainer.eval_dataset[360]["input_ids"][0] == 10_000

    small = HeldOut(held_out(200), batch_s=0.125)
    callback = run_to_first_plan(tmp_path, monkeypatch, small, batches=50)
    assert callback.eval_batches == 50 and len(small.eval_dataset) == 200


def test_the_losses_standard_error_is_over_batches_and_a_mixtures_is_its_weighted_means() -> None:
    """The Trainer hands each batch's loss over repeated once per row (the last batch's cut where its rows were
    duplicates across ranks): one value per batch counts."""
    losses = [1.0] * 4 + [3.0] * 4 + [2.0] * 2  # batches of 4 rows: losses 1, 3 and 2
    assert loss_standard_error(torch.tensor(losses).numpy(), 4) == {LOSS_SE: pytest.approx(1 / math.sqrt(3))}
    assert loss_standard_error([torch.tensor(losses[:4]).numpy(), torch.tensor(losses[4:]).numpy()], 4)[LOSS_SE] == (
        pytest.approx(1 / math.sqrt(3))
    )  # eval_do_concat_batches off: a list of arrays
    assert loss_standard_error(torch.tensor([2.0] * 4).numpy(), 4) == {}  # one batch: no spread to measure
    assert loss_standard_error(None, 4) == {}  # include_for_metrics without loss
    assert merged_figure("samples", [(30, 30), (10, 10)]) == 40
    assert merged_figure("loss", [(2.0, 30), (4.0, 10)]) == pytest.approx(2.5)
    assert merged_figure(LOSS_SE, [(0.1, 30), (0.2, 10)]) == pytest.approx(math.sqrt(3**2 + 2**2) / 40)


def tiny_trainer(tmp_path: Any, rows: int, batch: int, **options: Any) -> MLMTrainer:
    """A one-layer DistilBERT's MLMTrainer over ``rows`` held-out rows in batches of ``batch``, its evaluation
    figures the job's (train/run/build.py)."""
    torch.manual_seed(0)
    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    collator = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.3)
    examples = [
        {"input_ids": [2, 5 + i % 7, 9, 11 + i % 5, 3], "special_tokens_mask": [1, 0, 0, 0, 1], "sample_index": i}
        for i in range(rows)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_eval_batch_size=batch,
        remove_unused_columns=False, include_for_metrics=["loss"], **options,
    )  # fmt: skip
    return MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, eval_dataset=examples, data_collator=collator,
        compute_metrics=evaluation_metrics(args.eval_batch_size), preprocess_logits_for_metrics=argmax_logits,
        settings=trainer_settings(),
    )  # fmt: skip


def test_a_real_batch_is_measured_and_the_sets_evaluations_say_what_they_read(tmp_path: Any) -> None:
    """Through a real Trainer: the measuring leaves the model in train mode and keeps no loader (with persistent
    workers the Trainer would hand its whole-set loader to every later evaluation, the cut unread); an evaluation of
    the cut set says the examples it read and its loss's standard error over its batches."""
    trainer = tiny_trainer(tmp_path, rows=16, batch=4, dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer.model.train()
    assert evaluation_batch_seconds(trainer) > 0
    assert trainer.model.training and trainer.args.dataloader_persistent_workers
    assert not trainer.accelerator.gradient_state.in_dataloader  # the loader left after its second batch said so
    trainer.limit_evaluation(lambda examples: examples[:12])
    metrics = trainer.evaluate()
    assert metrics["eval_samples"] == 12
    trainer.model.eval()
    losses = [trainer.prediction_step(trainer.model, batch, True)[0].item() for batch in trainer.get_eval_dataloader()]
    assert len(losses) == 3 and metrics["eval_loss"] == pytest.approx(statistics.fmean(losses), rel=1e-5)
    assert metrics["eval_loss_se"] == pytest.approx(statistics.stdev(losses) / math.sqrt(3), rel=1e-4)
