"""``finetune``'s one fixed recipe (train/commands/finetune/command.py's docstring says why these values): its
settings as finetune_results.json records them, and as the TrainingArguments each seed trains with."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import TrainingArguments

from train.common.console import resolve_format
from train.config import Config
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


def arguments(config: Config, recipe: Recipe, seed: int) -> TrainingArguments:
    """The recipe as TrainingArguments; from the run's own only what the launcher decided for this machine (CPU
    or GPU, precision, the backend, the loader's workers): nothing is saved, evaluated during training or tracked."""
    training = config.training
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
        disable_tqdm=not bars_drawn(resolve_format(config.launch.log_format)),
    )
