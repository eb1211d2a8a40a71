"""The batches as training and evaluation see them: the masking collator the padding mode and the mask options call
for (train/model/collator.py), the figures of an evaluation (its masked-token accuracy, its loss's standard error, a
mixture's figures from its sources'), and the facts of the masking and layout
measured on drawn samples (the banner's and run.json's). Training (train/run/build.py) and evaluate-only
(train/commands/evaluate.py) build them here, so an evaluation masks as training's does."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import TrainingArguments

from train.borrowed.transformers_models import attn_implementation
from train.common.errors import ConfigError
from train.common.schedules import BatchWarmup
from train.config import DataArguments, MaskingArguments, ModelArguments, ScheduleArguments
from train.data import Corpus, Padding
from train.model import packing
from train.model.collator import MaskingCollator
from train.model.load import tokenizer_label
from train.model.words import word_starts
from train.outputs.facts import Masking, Packing

SAMPLES = "samples"  # eval_samples: the held-out examples an evaluation read (train/run/trainer.py evaluation_loop)
LOSS_SE = "loss_se"  # eval_loss_se: the standard error of its loss (loss_standard_error)


def evaluation_metrics(batch_size: int) -> Callable[[Any], dict[str, float]]:
    """An evaluation's ``compute_metrics``: the masked-token accuracy, and the loss's standard error from the
    per-batch losses the Trainer hands over with ``include_for_metrics`` naming ``loss`` (our default,
    train/config/schema.py), each repeated ``batch_size`` times (the Trainer's ``eval_batch_size``)."""

    def metrics(eval_pred: Any) -> dict[str, float]:
        return {**masked_accuracy(eval_pred), **loss_standard_error(eval_pred.losses, batch_size)}

    return metrics


def masked_accuracy(eval_pred: Any) -> dict[str, float]:
    predictions, labels = np.asarray(eval_pred.predictions), np.asarray(eval_pred.label_ids)
    masked = labels != -100
    return {"accuracy": float((predictions[masked] == labels[masked]).mean()) if masked.any() else 0.0}


def loss_standard_error(losses: Any, batch_size: int) -> dict[str, float]:
    """``{LOSS_SE: ...}``, the standard error of an evaluation's loss: the standard deviation of its per-batch losses
    (one degree of freedom taken) over the square root of their number; nothing without the losses or with fewer
    than two finite ones.

    Per batch because the Trainer's loss is a mean of batch losses (each a mean over its batch's masked tokens),
    each handed over repeated once per row of the batch (transformers 5.25, ``Trainer.evaluation_loop``:
    ``losses.repeat(batch_size)``, gathered across ranks, the last step's duplicated rows dropped): the first of
    every ``batch_size`` is one batch's. The batches are near-independent samples of the held-out text, so their
    spread says how far the loss of another sample of as many batches would land; it is what to compare a
    difference between two evaluations with, where a time budget's evaluation reads a sample of the set."""
    if losses is None:
        return {}
    flat = np.concatenate([np.ravel(part) for part in losses]) if isinstance(losses, list) else np.ravel(losses)
    per_batch = flat[::batch_size]
    per_batch = per_batch[np.isfinite(per_batch)]  # as the Trainer's loss leaves out non-finite ones
    if len(per_batch) < 2:
        return {}
    return {LOSS_SE: float(np.std(per_batch, ddof=1) / math.sqrt(len(per_batch)))}


def merged_figure(figure: str, values: list[tuple[float, int]]) -> float:
    """A mixture's ``figure`` over its whole held-out set from each source's (its figure, its examples):
    the examples summed; the loss's standard error that of the examples-weighted mean of the sources' losses,
    the square root of the sum of (examples x standard error) squared over all the examples (the sources
    sampled independently); any other figure the mean weighted by examples (train/run/trainer.py's
    MLMTrainer.evaluation_loop)."""
    total = sum(examples for _, examples in values)
    if figure == SAMPLES:
        return total
    if figure == LOSS_SE:
        return math.sqrt(sum((value * examples) ** 2 for value, examples in values)) / max(total, 1)
    return sum(value * examples for value, examples in values) / max(total, 1)


def argmax_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Keep predicted ids, not [batch, length, vocab] logits, across evaluation batches; the masked-only head
    (train/model/head.py) hands over the ids already."""
    return logits if not logits.is_floating_point() else logits.argmax(dim=-1)


def masking_collator(
    data: DataArguments, masking: MaskingArguments, model: ModelArguments, seed: int, tokenizer: Any, module: Any
) -> MaskingCollator:
    """The batches' masking and layout (train/model/collator.py), as the padding mode has them: for documents kept
    apart, the model (``module``) is prepared to take their boundaries (train/model/packing.py). ``model``'s options
    name the tokenizer in whole-word masking's errors. Training and evaluate-only (train/commands/evaluate.py) build
    it here, so an evaluation masks as training's does."""
    padding = Padding(data.padding)
    isolate = None
    if padding.isolates:
        check_isolation(data, module.config, attn_implementation(module.config))
        packing.prepare_model(module)
        isolate = functools.partial(
            packing.isolated_inputs,
            config=module.config,
            attn_implementation=attn_implementation(module.config),
            dtype=module.dtype,
        )
    return MaskingCollator(
        pad_token_id=tokenizer.pad_token_id,
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=len(tokenizer),
        # With a rate schedule, masked at its highest rate; the Trainer keeps each step's share (thin_masks).
        mlm_probability=max(masking.mlm_probability, masking.final_mlm_probability or 0.0),
        mask_draws=masking.final_mlm_probability is not None,
        mask_replace_prob=masking.mask_replace_prob,
        random_replace_prob=masking.random_replace_prob,
        seed=seed,
        pad_to_multiple_of=padding.pad_multiple(data.pad_to_multiple_of),
        word_start=word_starts(tokenizer, tokenizer_label(model)) if masking.whole_word_mask else None,
        isolate=isolate,
        flatten=padding.flattens,
    )


def batch_warmup(schedule: ScheduleArguments, training: TrainingArguments) -> BatchWarmup | None:
    """The run's batch warm-up (train/common/schedules.py), in global rows: per-device batch x accumulation x
    ranks at full size, each rank training a row of each micro-batch at least; None without one."""
    if schedule.batch_warmup_ratio <= 0:
        return None
    unit = max(training.world_size, 1) * training.gradient_accumulation_steps
    full = training.per_device_train_batch_size * unit
    return BatchWarmup(full=full, start=schedule.batch_warmup_start, ratio=schedule.batch_warmup_ratio, unit=unit)


def check_batch_warmup(schedule: ScheduleArguments, data: DataArguments) -> None:
    """ConfigError, naming MLM_BATCH_WARMUP_RATIO, where a batch warm-up has no rows to leave out: a padding-free
    batch is one row of all its examples."""
    if schedule.batch_warmup_ratio > 0 and Padding(data.padding).flattens:
        raise ConfigError(
            f"{schedule.source_of('batch_warmup_ratio')}={schedule.batch_warmup_ratio:g}: a batch warm-up trains "
            f"fewer rows of each batch, and {data.source_of('padding')}={data.padding} lays a batch out as "
            "one row; use padding packed or dynamic, or no batch warm-up (0)"
        )


MEASURED_SAMPLES = 256  # samples collated to measure the masking rate and the efficiency: a few milliseconds


def check_isolation(data: DataArguments, model_config: Any, attn_implementation: str | None) -> None:
    """ConfigError, naming MLM_PADDING, when this model cannot keep a row's documents apart."""
    reason = packing.unsupported_reason(model_config, attn_implementation)
    if reason is not None:
        raise ConfigError(
            f"{data.source_of('padding')}={data.padding}: {reason}; use padding packed_crossing or dynamic"
        )


def batch_facts(
    masking: MaskingArguments,
    data: DataArguments,
    training: TrainingArguments,
    collator: MaskingCollator,
    corpus: Corpus,
) -> tuple[Masking, Packing]:
    """How the training data is masked and laid out, measured on samples drawn at random (seeded) in training-size
    batches, as the Trainer's shuffled sampler draws them: neighbouring lines of a file tend to be alike in length,
    so the first ones would overstate a padded layout's efficiency (a stream's are not read twice: its evaluation
    samples, masked as training masks them, stand in; None without either): the configured rates and the
    realised share of real tokens masked (special tokens are never masked, and whole words mask as many tokens as
    the chosen words have, so it is what the loss really averages over); the padding mode and its efficiency,
    real tokens per position computed."""
    size = training.per_device_train_batch_size
    dataset = corpus.train if not corpus.streaming else corpus.validation
    count = min(MEASURED_SAMPLES, len(dataset)) if dataset is not None else 0
    drawn = random.Random(training.seed).sample(range(len(dataset)), count) if dataset is not None else []
    sample = [dataset[i] for i in drawn] if dataset is not None else []
    at_first = collator.for_evaluation(masking.mlm_probability)  # the first step's rate (a schedule: its highest)
    measured = at_first.measure([sample[i : i + size] for i in range(0, len(sample), size)])
    rates = Masking(
        mlm_probability=masking.mlm_probability,
        final_mlm_probability=masking.final_mlm_probability,
        eval_mlm_probability=masking.eval_mlm_probability or masking.mlm_probability,
        whole_word_mask=masking.whole_word_mask,
        realised=_rounded(measured["realised"]),
        realised_on_samples=len(sample),
    )
    layout = Packing(
        padding=data.padding,
        documents_apart=Padding(data.padding).isolates,
        efficiency=_rounded(measured["efficiency"]),
    )
    return rates, layout


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
