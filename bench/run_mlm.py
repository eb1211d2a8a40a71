"""``python -m bench.run_mlm [options]``: transformers' run_mlm.py recipe, from scratch on a text file, plus the probe.

What ``examples/pytorch/language-modeling/run_mlm.py`` does for ``--model_type <type> --config_overrides ...
--tokenizer_name DIR --train_file FILE.txt --do_train``, in its order and with its defaults, cut down to that
case (no hub, no evaluation, no checkpoint to resume): the ``text`` builder reads one example per line; a model
config from ``CONFIG_MAPPING[model_type]()`` updated from the overrides, ``AutoModelForMaskedLM.from_config`` (the
dense head: the vocabulary projection at every position), embeddings resized if the tokenizer is larger; then
either ``line_by_line`` (each non-empty line tokenized alone, cut to max_seq_length, no padding stored) or, by
default, every line tokenized whole and ``group_texts`` concatenating each map batch of 1,000 lines and cutting
it into max_seq_length blocks (the remainder of each batch dropped); ``DataCollatorForLanguageModeling`` pads
each batch to its longest row (to a multiple of 8 only for line_by_line with fp16) and masks it; the stock
``Trainer`` with ``TrainingArguments`` as given, then ``trainer.save_model()`` and the train metrics.

bench/runner.py starts it under torchrun in place of bench.harness; with ``BENCH_PROBE_FILE`` set it carries the
same probe (bench/probe.py), so both recipes are timed alike. Not a copy of the script: its steps for this case.
"""

from __future__ import annotations

import time

STARTED = time.time()  # this rank's Python is up; what follows until IMPORTED is importing torch and transformers

import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import datasets  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import (  # noqa: E402
    CONFIG_MAPPING,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from bench.grouping import group_texts  # noqa: E402
from bench.probe import PROBE_FILE_ENV, StepProbe  # noqa: E402
from train.data import real_token_count  # noqa: E402

IMPORTED = time.time()


@dataclass
class RecipeArguments:
    """run_mlm.py's ModelArguments and DataTrainingArguments that this case uses, with its defaults."""

    train_file: str = field(metadata={"help": "A .txt file, one example per line."})
    tokenizer_name: str = field(metadata={"help": "Directory of the tokenizer (run_mlm.py trains none)."})
    model_type: str = field(default="distilbert", metadata={"help": "Architecture built from its config."})
    config_overrides: str | None = field(default=None, metadata={"help": "e.g. n_layers=2,dim=128"})
    line_by_line: bool = field(default=False, metadata={"help": "One example per line, else group_texts blocks."})
    max_seq_length: int | None = field(default=None, metadata={"help": "Default: the tokenizer's, at most 1024."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens masked."})
    pad_to_max_length: bool = field(default=False, metadata={"help": "line_by_line: pad every line when tokenizing."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for map."})


def parse(argv: list[str]) -> tuple[RecipeArguments, TrainingArguments]:
    parser = HfArgumentParser((RecipeArguments, TrainingArguments))
    recipe, training = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    return recipe, training


def sequence_length(recipe: RecipeArguments, tokenizer: Any) -> int:
    """run_mlm.py's rule: the given length capped at the tokenizer's, or the tokenizer's capped at 1024."""
    if recipe.max_seq_length is None:
        return min(tokenizer.model_max_length, 1024)
    return min(recipe.max_seq_length, tokenizer.model_max_length)


def build_model(recipe: RecipeArguments, tokenizer: Any) -> Any:
    config = CONFIG_MAPPING[recipe.model_type]()
    if recipe.config_overrides is not None:
        config.update_from_string(recipe.config_overrides)
    model = AutoModelForMaskedLM.from_config(config)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    return model


def tokenized_train(recipe: RecipeArguments, tokenizer: Any, training: TrainingArguments) -> Any:
    """The training split as run_mlm.py prepares it (cached by datasets under HF_HOME, as the script's is)."""
    raw = datasets.load_dataset("text", data_files={"train": recipe.train_file})
    block = sequence_length(recipe, tokenizer)
    if recipe.line_by_line:
        padding = "max_length" if recipe.pad_to_max_length else False

        def tokenize_lines(examples: dict[str, list[str]]) -> Any:
            examples["text"] = [line for line in examples["text"] if len(line) > 0 and not line.isspace()]
            return tokenizer(
                examples["text"], padding=padding, truncation=True, max_length=block, return_special_tokens_mask=True
            )

        with training.main_process_first(desc="dataset map tokenization"):
            tokenized = raw.map(
                tokenize_lines,
                batched=True,
                num_proc=recipe.preprocessing_num_workers,
                remove_columns=["text"],
                desc="Running tokenizer on dataset line_by_line",
            )
        return tokenized["train"]

    def tokenize_all(examples: dict[str, list[str]]) -> Any:
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    with training.main_process_first(desc="dataset map tokenization"):
        tokenized = raw.map(
            tokenize_all,
            batched=True,
            num_proc=recipe.preprocessing_num_workers,
            remove_columns=["text"],
            desc="Running tokenizer on every text in dataset",
        )
    with training.main_process_first(desc="grouping texts together"):
        grouped = tokenized.map(
            group_texts,
            batched=True,
            fn_kwargs={"block": block},
            num_proc=recipe.preprocessing_num_workers,
            desc=f"Grouping into {block}",
        )
    return grouped["train"]


def main(argv: list[str]) -> int:
    recipe, training = parse(argv)
    set_seed(training.seed)
    tokenizer = AutoTokenizer.from_pretrained(recipe.tokenizer_name)
    model = build_model(recipe, tokenizer)
    train_dataset = tokenized_train(recipe, tokenizer, training)
    pad_to_multiple_of_8 = recipe.line_by_line and training.fp16 and not recipe.pad_to_max_length
    collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm_probability=recipe.mlm_probability,
        pad_to_multiple_of=8 if pad_to_multiple_of_8 else None,
    )
    trainer = Trainer(
        model=model, args=training, train_dataset=train_dataset, processing_class=tokenizer, data_collator=collator
    )
    if os.environ.get(PROBE_FILE_ENV):
        # The probe reads the Trainer's real-token count, as it does for our job (where it is the default).
        # Set here, not as a flag: HfArgumentParser reads this ``str | bool`` field as a bool, so run_mlm.py's
        # command line cannot say non_padding (train.config.tokens_seen_mode).
        training.include_num_input_tokens_seen = "non_padding"
        facts = {
            "train_samples": len(train_dataset),
            "train_real_tokens": real_token_count(train_dataset, tokenizer.pad_token_id),
        }
        settings = {
            "padding": "dynamic" if recipe.line_by_line else "packed",
            "max_seq_length": sequence_length(recipe, tokenizer),
            "masked_only_head": False,
            "mlm_probability": recipe.mlm_probability,
        }
        trainer.add_callback(StepProbe(Path(os.environ[PROBE_FILE_ENV]), facts, model, settings, STARTED, IMPORTED))
    result = trainer.train()
    trainer.save_model()
    metrics = {**result.metrics, "train_samples": len(train_dataset)}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    sys.exit(code)
