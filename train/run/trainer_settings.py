"""What the job gives its Trainer (train/run/trainer.py's MLMTrainer), as one frozen value handed over at
construction: nothing sets a trainer's attributes afterwards, and a setting left out is a type error, not a default
(docs/development.md). ``None`` only where it means something: no schedule, no warm-up, no mixture, no resumed
stream. Beside it, the settings the job and evaluate read the same way: evaluation's masking, a resumed stream's
position."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from train.common import distributed
from train.common.console import warn
from train.common.phase import PhaseFacts
from train.common.schedules import BatchWarmup
from train.config import DataArguments, MaskingArguments
from train.data import Corpus, StreamPosition
from train.machine.peaks import Peak
from train.model.collator import MaskingCollator, evaluation_rate
from train.run.diagnostics import TokenFlops
from train.run.rollback import DataSkip
from train.run.saving import CheckpointWriter


@dataclass(frozen=True)
class HeadTraining:
    """How the MLM head trains beside the encoder (train/run/adapting.py head_training decides it)."""

    parameters: tuple[Any, ...]  # the head's (train/model/adapting.py head_parameters)
    learning_rate: float | None  # the head's own rate (the head_learning_rate option); None: the encoder's
    warmup_steps: int  # the first steps, in which only the head trains; adapting.py's AUTO_WARMUP: derived at step 0
    frozen: tuple[Any, ...]  # the parameters that do not train until then: the encoder's


HEAD_WITH_ENCODER = HeadTraining(parameters=(), learning_rate=None, warmup_steps=0, frozen=())  # nothing apart


@dataclass(frozen=True)
class TrainerSettings:
    """Every setting of the job's Trainer (the attributes the Trainer itself computes as it trains - the step's
    mask rate and rows, a derived head warm-up, a held-out set a time budget cut - are its own)."""

    eval_collator: MaskingCollator | None  # evaluation's masking (its own rate); None: training's collator
    eval_parts: dict[str, Any] | None  # a mixture's held-out part per source (train/data/corpus.py); None: one set
    decay_ratio: float  # warmup_stable_decay's decay as a fraction of the steps (the decay_ratio option)
    mask_rates: tuple[float, float] | None  # a mask rate schedule's first and final rates; None: no schedule
    batch_warmup: BatchWarmup | None  # a global batch growing over the first steps (train/run/batches.py)
    phase: PhaseFacts | None  # a phased run's phase (train/launch/phases.py): the schedule is the plan's
    head: HeadTraining  # the head's parameters, rate and warm-up (train/run/adapting.py)
    drift_batch: dict[str, Any] | None  # held-out rows the encoder's drift is measured on (adapting.py); None: not
    stream_position: dict[str, Any] | None  # a resumed stream's saved position for this rank; None: from its start
    stream_part: Callable[[int, int], Any] | None  # (rank, world size) -> that rank's part of the resumed stream
    token_flops: TokenFlops | None  # the model's sizes a step's FLOPs are counted from (train/run/diagnostics.py)
    peak: Peak | None  # the device's peak the records' MFU is a share of (train/machine/peaks.py); None: no MFU
    saves: CheckpointWriter | None  # checkpoints saved behind the loop (train/run/saving.py); None: synchronously
    # the batches a rollback leaves out, drawn and dropped when the loop starts again (train/run/rollback.py)
    skip: DataSkip = field(default_factory=DataSkip)


def evaluation_collator(masking: MaskingArguments, collator: MaskingCollator) -> MaskingCollator:
    """Evaluation's masking, training's evaluations' and evaluate's alike: ``collator`` at eval_mlm_probability, at
    a schedule's first rate, or as it is (train/model/collator.py evaluation_rate)."""
    rate = evaluation_rate(masking.mlm_probability, masking.final_mlm_probability, masking.eval_mlm_probability)
    return collator.for_evaluation(rate)


def mask_rates(masking: MaskingArguments) -> tuple[float, float] | None:
    """A mask rate schedule's first and final rates (final_mlm_probability set), else None."""
    final = masking.final_mlm_probability
    return None if final is None else (masking.mlm_probability, final)


def resumed_stream(
    training: TrainingArguments, data: DataArguments, corpus: Corpus, resume: str | None
) -> tuple[dict[str, Any] | None, Callable[[int, int], Any] | None]:
    """A resumed stream's saved position for this rank and the corpus's parts of it (each None otherwise): where
    the Trainer's loader starts."""
    if not resume or not corpus.streaming:
        return None, None
    label = data.source_of("streaming")
    position = StreamPosition.load(resume, training.process_index, training.world_size, label)
    if position is None and distributed.is_world_zero():
        warn(f"{resume} holds no stream position (saved by a run without streaming): the stream starts over")
    return position, corpus.stream_part


def evaluation_settings(
    masking: MaskingArguments, decay_ratio: float, collator: MaskingCollator, parts: dict[str, Any] | None
) -> TrainerSettings:
    """The settings of a Trainer that only evaluates (train/run/evaluate.py): training's evaluation masking and a
    mixture's parts; what only training reads (its rate and batch schedules, the head's, the stream's) off."""
    return TrainerSettings(
        eval_collator=evaluation_collator(masking, collator),
        eval_parts=parts,
        decay_ratio=decay_ratio,
        mask_rates=None,
        batch_warmup=None,
        phase=None,
        head=HEAD_WITH_ENCODER,
        drift_batch=None,
        stream_position=None,
        stream_part=None,
        token_flops=None,
        peak=None,
        saves=None,
    )
