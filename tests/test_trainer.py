"""The Trainer workarounds that can be checked without training: which weights are tied."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from transformers import DistilBertConfig, DistilBertForMaskedLM

from tests.helpers import trainer_settings
from train.run.trainer import apply_ddp_timeout, tied_parameter_names


def test_tied_weights_are_named_and_nothing_else() -> None:
    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    model = DistilBertForMaskedLM(config)
    assert tied_parameter_names(model) == {"distilbert.embeddings.word_embeddings.weight", "vocab_projector.weight"}
    assert tied_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == set()


def test_evaluation_batches_come_from_the_evaluation_collator(tmp_path) -> None:
    from transformers import TrainingArguments

    from train.model.collator import MaskingCollator
    from train.run.trainer import MLMTrainer

    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    training = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.3)
    evaluation = training.for_evaluation(0.15)
    rows = [{"input_ids": [2, 7, 8, 3], "special_tokens_mask": [1, 0, 0, 1], "sample_index": i} for i in range(4)]
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], dataloader_num_workers=0)
    trainer = MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, train_dataset=rows, eval_dataset=rows, data_collator=training,
        settings=trainer_settings(eval_collator=evaluation),
    )  # fmt: skip

    def collator_of(loader) -> object:  # the Trainer wraps it to drop the columns the model does not take
        return getattr(loader.collate_fn, "data_collator", loader.collate_fn)

    assert collator_of(trainer.get_eval_dataloader()) is evaluation
    assert trainer.data_collator is training and collator_of(trainer.get_train_dataloader()) is training


def test_the_trainer_takes_its_settings_whole_at_construction(tmp_path) -> None:
    """A setting left out is a type error, not a default; the settings cannot change afterwards; and the class keeps
    none of them (nor the state it computes as it trains) as a class attribute every trainer would share."""
    import dataclasses

    from transformers import TrainingArguments

    from train.run.trainer import MLMTrainer
    from train.run.trainer_settings import TrainerSettings

    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(TypeError, match="settings"):
        MLMTrainer(model=DistilBertForMaskedLM(config), args=args)
    given = {f.name: getattr(trainer_settings(), f.name) for f in dataclasses.fields(TrainerSettings)}
    with pytest.raises(TypeError, match="decay_ratio"):
        TrainerSettings(**{name: value for name, value in given.items() if name != "decay_ratio"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        trainer_settings().decay_ratio = 0.5
    own = ["mask_rate_now", "batch_rows_now", "head_warmup_steps", "eval_parts", "settings"]
    assert [name for name in [*given, *own] if name in vars(MLMTrainer)] == []


def test_a_cpu_process_group_takes_the_ddp_timeout(tmp_path):
    """TrainingArguments hands ddp_timeout to a GPU group only; apply_ddp_timeout gives it to gloo through torch's
    public ``set_timeout`` (torch 2.15; it was the private ``_set_pg_timeout``)."""
    assert not dist.is_initialized(), "a test left a process group behind"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        apply_ddp_timeout(SimpleNamespace(use_cpu=True, ddp_timeout_delta=timedelta(seconds=77)))
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout == timedelta(seconds=77)
    finally:
        dist.destroy_process_group()


def test_saved_weights_follow_the_umask_as_every_other_file(tmp_path) -> None:
    """safetensors 0.8 writes model.safetensors 0600: another user ID reading the output volume could not load it
    (issue 51). A umask other than the usual 022 shows the mode is the umask's, not a fixed 0644."""
    import os

    from transformers import TrainingArguments

    from train.common.writable import current_umask
    from train.run.trainer import MLMTrainer

    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = MLMTrainer(model=DistilBertForMaskedLM(config), args=args, settings=trainer_settings())
    before = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        trainer.save_model(str(tmp_path / "final"))  # final/'s save; a checkpoint's ends in the same save_weights
    finally:
        os.umask(before)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "final").iterdir()}
    assert modes["model.safetensors"] == 0o640 and set(modes.values()) == {0o640}, modes


def test_a_mask_rate_schedule_trains_each_step_at_its_rate_and_logs_it(tmp_path) -> None:
    """The collator masks at the schedule's highest rate with draws; each optimizer step's batches reach the model
    thinned to the step's rate (no draws among its inputs), counted after thinning, and each record logs the rate."""
    from transformers import TrainingArguments

    from train.common.schedules import mask_rate
    from train.model.collator import IGNORE_INDEX, MaskingCollator
    from train.run.trainer import MLMTrainer

    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=64)
    collator = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.6, mask_draws=True)
    rows = [
        {"input_ids": [2, *[5 + (i + j) % 40 for j in range(60)], 3], "special_tokens_mask": [1] + [0] * 60 + [1],
         "sample_index": i}
        for i in range(64)
    ]  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=8, per_device_train_batch_size=8,
        logging_steps=1, save_strategy="no", dataloader_num_workers=0, remove_unused_columns=False,
    )  # fmt: skip
    trainer = MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, train_dataset=rows, data_collator=collator,
        settings=trainer_settings(mask_rates=(0.6, 0.1)),
    )  # fmt: skip
    masked_shares = []
    forward = trainer.model.forward

    def counting(**inputs):  # what reaches the model: no draws, masks at the step's rate
        assert set(inputs) == {"input_ids", "attention_mask", "labels", "num_items_in_batch"}, set(inputs)
        masked = inputs["labels"] != IGNORE_INDEX
        assert int(inputs["num_items_in_batch"]) == int(masked.sum())  # the loss's count is the thinned one
        masked_shares.append(float(masked.float().mean()))
        return forward(**inputs)

    trainer.model.forward = counting
    trainer.train()
    rates = [record["mlm_probability"] for record in trainer.state.log_history if "loss" in record]
    assert rates == [round(mask_rate(0.6, 0.1, step, 8), 6) for step in range(8)]
    assert masked_shares[0] > 0.45 and masked_shares[-1] < 0.25, masked_shares


def test_the_mask_rate_goes_linearly_from_the_first_to_the_final_rate_over_the_planned_steps() -> None:
    from train.common.schedules import mask_rate

    assert [mask_rate(0.3, 0.1, step, 4) for step in range(4)] == pytest.approx([0.3, 0.25, 0.2, 0.15])
    assert mask_rate(0.3, None, 3, 4) == 0.3 and mask_rate(0.15, 0.3, 2, 4) == pytest.approx(0.225)
    assert mask_rate(0.3, 0.1, 9, 4) == pytest.approx(0.1)  # a re-plan shorter than the steps done: the end


def test_a_mixtures_evaluation_gives_a_loss_per_source_and_their_weighted_mean_in_one_record(tmp_path) -> None:
    from transformers import TrainerCallback, TrainingArguments

    from train.model.collator import MaskingCollator
    from train.run.batches import argmax_logits, evaluation_metrics
    from train.run.trainer import MLMTrainer

    torch.manual_seed(0)
    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    collator = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.5)

    def rows(tokens: list[int], count: int, first: int) -> list[dict]:
        return [
            {"input_ids": [2, *tokens, 3], "special_tokens_mask": [1] + [0] * len(tokens) + [1], "sample_index": i}
            for i in range(first, first + count)
        ]

    parts = {"news": rows([7, 8, 9, 10], 6, 0), "legal": rows([30, 31, 32, 33, 34, 35], 4, 6)}
    whole = parts["news"] + parts["legal"]
    seen: list[dict] = []

    class Evaluations(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):  # noqa: ANN001, ANN201
            seen.append(dict(metrics or {}))

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_eval_batch_size=2, remove_unused_columns=False,
        include_for_metrics=["loss"],
    )  # fmt: skip
    trainer = MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, eval_dataset=whole, data_collator=collator,
        compute_metrics=evaluation_metrics(2), preprocess_logits_for_metrics=argmax_logits,
        callbacks=[Evaluations()], settings=trainer_settings(eval_parts=parts),
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert len(seen) == 1 and seen[0]["eval_news_loss"] == metrics["eval_news_loss"]  # one evaluation, not three
    expected = (6 * metrics["eval_news_loss"] + 4 * metrics["eval_legal_loss"]) / 10
    assert metrics["eval_loss"] == pytest.approx(expected)
    assert metrics["eval_news_loss"] != metrics["eval_legal_loss"]
    # What it read, each source's and the whole's, and the standard error of the whole's weighted mean
    assert (metrics["eval_news_samples"], metrics["eval_legal_samples"], metrics["eval_samples"]) == (6, 4, 10)
    news, legal = metrics["eval_news_loss_se"], metrics["eval_legal_loss_se"]
    assert metrics["eval_loss_se"] == pytest.approx(((6 * news) ** 2 + (4 * legal) ** 2) ** 0.5 / 10)
    other = trainer.evaluate(eval_dataset=parts["legal"])  # a set given by name: evaluated as it is
    assert "eval_legal_loss" not in other and other["eval_loss"] > 0 and other["eval_samples"] == 4


def test_a_batch_warm_up_trains_each_step_on_its_rows_and_logs_them(tmp_path) -> None:
    """Each optimizer step's batches reach the model cut to the step's rows (train/common/schedules.py), the
    Trainer counts those rows' tokens, and each record logs the step's global rows."""
    from transformers import TrainingArguments

    from train.common.schedules import BatchWarmup
    from train.model.collator import MaskingCollator
    from train.run.trainer import MLMTrainer

    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=64)
    collator = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.3)
    rows = [
        {"input_ids": [2, *[5 + (i + j) % 40 for j in range(10)], 3], "special_tokens_mask": [1] + [0] * 10 + [1],
         "sample_index": i}
        for i in range(64)
    ]  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=8, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, logging_steps=1, save_strategy="no", dataloader_num_workers=0,
        remove_unused_columns=False, include_num_input_tokens_seen="non_padding",
    )  # fmt: skip
    warmup = BatchWarmup(full=8, start=0.25, ratio=0.5, unit=2)
    trainer = MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, train_dataset=rows, data_collator=collator,
        settings=trainer_settings(batch_warmup=warmup),
    )  # fmt: skip
    seen: list[int] = []
    forward = trainer.model.forward

    def counting(**inputs):
        seen.append(inputs["input_ids"].shape[0])
        return forward(**inputs)

    trainer.model.forward = counting
    trainer.train()
    logged = [record["batch_rows"] for record in trainer.state.log_history if "loss" in record]
    assert logged == [warmup.rows(step, 8) for step in range(8)] == [2, 4, 4, 6, 8, 8, 8, 8]
    assert [seen[i] + seen[i + 1] for i in range(0, 16, 2)] == logged  # two micro-batches a step
    assert trainer.state.num_input_tokens_seen == sum(logged) * 12
    # The log's ETA counts in the plan's full steps (train/run/logs.py): the ramp's steps cost their shares.
    assert trainer.steps_cost(0, 8) == warmup.full_steps(0, 8) < 8
    assert trainer.steps_cost(4, 8) == 4  # the ramp is over after step 4
