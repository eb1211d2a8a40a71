"""The schema: every option a user can set, each with its type, default, help and bound in one place.

Our options are the fields of the sections (train/config/sections.py); every field of
``transformers.TrainingArguments`` follows them, with our defaults where they differ (:data:`PROJECT_DEFAULTS`)
and our bounds (:data:`TRAINING_BOUNDS`: the Trainer's class is not ours to annotate, and the Trainer pickles it
into every checkpoint, so it stays the Trainer's own). An option's help ends with its bound's words
(:func:`train.config.bounds.help_with`); the environment variable, YAML key, CLI flag and docs/options.md row are
all derived from the field's name, whatever its section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from train.config.bounds import BOUND, TRAINING_BOUNDS, Bound
from train.config.sections import SECTIONS

ENV_PREFIX = "MLM_"
# MLM_* variables that are not options: read by entrypoint.sh / the launcher / logging, documented in docs/options.md.
NON_OPTION_ENV = {"MLM_CONFIG", "MLM_DEBUG", "MLM_EXIT_DIR", "MLM_LAUNCH", "MLM_PYTHON"}
SECRET_FIELDS = {"hub_token"}


def env_name(name: str) -> str:
    """The environment variable of an option: ``MLM_`` + its name in upper case."""
    return ENV_PREFIX + name.upper()


# Our defaults for TrainingArguments fields where the Trainer's own differ. Both presets state their values
# explicitly; these apply when nothing else is given.
PROJECT_DEFAULTS: dict[str, Any] = {
    "output_dir": "./output",
    "num_train_epochs": 2.0,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 32,
    "eval_strategy": "epoch",
    "save_strategy": "epoch",
    "logging_steps": 50,
    "save_total_limit": 2,
    # TensorBoard events under output_dir/logs (the package is in the lock); none turns them off, naming other
    # integrations replaces them.
    "report_to": ["tensorboard"],
    "optim": "adamw_torch_fused",
    "dataloader_num_workers": 2,
    # The collator needs each sample's index to make masking a pure function of (seed, epoch, index).
    "remove_unused_columns": False,
    # Masked LMs use every parameter in every step; searching for unused ones costs a graph traversal per step.
    "ddp_find_unused_parameters": False,
    # Real (non-padding) tokens counted by the Trainer each step (attention mask, else pad ids) for the logs'
    # tokens/s and num_input_tokens_seen: exact, where an average per sample is not (dynamic padding, streams).
    # Costs no extra GPU wait: the Trainer already reads each step's loss back for logging_nan_inf_filter.
    "include_num_input_tokens_seen": "non_padding",
    # Each evaluation batch's loss handed to compute_metrics, for the loss's standard error (eval_loss_se,
    # train/run/batches.py loss_standard_error): the Trainer keeps them for its mean anyway.
    "include_for_metrics": ["loss"],
    "seed": 42,
}

# Our options by name, whatever their section, and the section each belongs to.
SECTION_OF: Mapping[str, str] = MappingProxyType(
    {f.name: name for name, section in SECTIONS for f in dataclasses.fields(section)}
)
JOB_FIELDS = tuple(SECTION_OF)
# Every option's bound by name: the one table validation iterates.
BOUNDS: Mapping[str, Bound] = MappingProxyType(
    {
        **{
            f.name: f.metadata[BOUND]
            for _, section in SECTIONS
            for f in dataclasses.fields(section)
            if f.metadata.get(BOUND)
        },
        **TRAINING_BOUNDS,
    }
)
