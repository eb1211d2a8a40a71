"""``finetune``'s one fixed recipe (train/commands/finetune/command.py's docstring says why these values): its
settings as finetune_results.json records them, and as the TrainingArguments each seed trains with."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import TrainingArguments

from train.common.console import resolve_format
from train.config import TaskArguments
from train.run.logs import bars_drawn

BATCH_SIZE = 32  # in total across ranks
WARMUP = 0.1  # a fraction of the steps (TrainingArguments' warmup_steps below 1)
WEIGHT_DECAY = 0.01
SCHEDULER = "linear"
OPTIMIZER = "adamw_torch"  # AdamW with the Trainer's betas (0.9, 0.999) and eps 1e-8


@dataclass(frozen=True)
class Recipe:
    """Every setting of the fine-tuning, as finetune_results.json records it."""

    learning_rate: float
    epochs: int
    seeds: list[int]
    max_length: int
    batch_size: int = BATCH_SIZE
    per_device_batch_size: int = BATCH_SIZE
    warmup_ratio: float = WARMUP
    lr_scheduler: str = SCHEDULER
    weight_decay: float = WEIGHT_DECAY
    optimizer: str = OPTIMIZER


def recipe_for(task: TaskArguments, max_seq_length: int, world_size: int) -> Recipe:
    """The recipe as the task options set it, the batch split over ``world_size`` ranks; its max_length is the
    longest any model may read (each model's own is cut to its positions, command.py's ``longest``)."""
    per_device = max(1, BATCH_SIZE // world_size)
    return Recipe(
        learning_rate=task.task_learning_rate,
        epochs=task.task_epochs,
        seeds=list(range(task.task_seeds)),
        max_length=max_seq_length,
        batch_size=per_device * world_size,
        per_device_batch_size=per_device,
    )


@dataclass(frozen=True)
class Machine:
    """What the job's options say of this machine, where every seed trains: the TrainingArguments the launcher
    settled (CPU or GPU, precision, the backend, the loader's workers, the world size, output_dir), the padding
    multiple (1 on CPU unless set) and the console's log format."""

    training: TrainingArguments
    pad_to_multiple_of: int
    log_format: str


def arguments(machine: Machine, recipe: Recipe, seed: int) -> TrainingArguments:
    """The recipe as TrainingArguments; from the run's own only what the launcher decided for this machine (CPU
    or GPU, precision, the backend, the loader's workers): nothing is saved, evaluated during training or tracked."""
    training = machine.training
    return TrainingArguments(
        output_dir=training.output_dir,
        learning_rate=recipe.learning_rate,
        num_train_epochs=recipe.epochs,
        per_device_train_batch_size=recipe.per_device_batch_size,
        per_device_eval_batch_size=training.per_device_eval_batch_size,
        lr_scheduler_type=recipe.lr_scheduler,
        warmup_steps=recipe.warmup_ratio,
        weight_decay=recipe.weight_decay,
        optim=recipe.optimizer,
        seed=seed,
        data_seed=seed,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        use_cpu=training.use_cpu,
        bf16=training.bf16,
        fp16=training.fp16,
        ddp_backend=training.ddp_backend,
        ddp_timeout=training.ddp_timeout,
        dataloader_num_workers=training.dataloader_num_workers,
        dataloader_pin_memory=training.dataloader_pin_memory and not training.use_cpu,
        disable_tqdm=not bars_drawn(resolve_format(machine.log_format)),
    )
