"""The resolved configuration: the options after every layer (train/config/layers.py), where each value came
from, and what the job moved out of the Trainer's hands (the Hub push, an output_dir in a store)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from transformers import TrainingArguments

from train.common.urls import without_credentials
from train.config.bounds import Section
from train.config.resilience import ResilienceArguments
from train.config.schema import SECRET_FIELDS, SECTION_OF
from train.config.sections import (
    AdaptingArguments,
    BudgetArguments,
    CheckpointArguments,
    DataArguments,
    LaunchArguments,
    MaskingArguments,
    ModelArguments,
    OutputArguments,
    ScheduleArguments,
    TaskArguments,
)

REDACTED = "***"


@dataclass
class Config:
    """The resolved configuration: one of each section (train/config/sections.py), the Trainer's arguments, and
    where each non-default value came from. Handed whole only to the few places that assemble the sections (the
    job's build, the launcher's plan, doctor); every other function takes the section or the values it reads."""

    model: ModelArguments
    data: DataArguments
    masking: MaskingArguments
    schedule: ScheduleArguments
    adapting: AdaptingArguments
    checkpoint: CheckpointArguments
    outputs: OutputArguments
    launch: LaunchArguments
    budget: BudgetArguments
    resilience: ResilienceArguments
    task: TaskArguments
    training: TrainingArguments
    sources: dict[str, str]
    # MLM_PUSH_TO_HUB as the user set it: the job pushes final/, the Trainer is told not to (see take_over_push).
    push_to_hub: bool = False
    # output_dir as the user set it when it is a store's URL (training.output_dir is then the staging directory,
    # see stage_outputs), and where it was set.
    output_store: str | None = None
    output_store_source: str = "output_dir"

    def __post_init__(self) -> None:
        for section in self.sections():
            section.sources = self.sources  # one map, so a source set later (staging_dir's) reaches every section

    def sections(self) -> tuple[Section, ...]:
        """Our sections, in the schema's order."""
        return tuple(getattr(self, name) for name in dict.fromkeys(SECTION_OF.values()))

    def option(self, name: str) -> Any:
        """An option's value by its name, whatever its section (the Trainer's options too)."""
        section = SECTION_OF.get(name)
        return getattr(getattr(self, section) if section else self.training, name)

    def source_of(self, name: str) -> str:
        """Where an option was set, as errors name it (``MLM_SEED``, ``job.yaml: seed``, ``--seed``), else its name."""
        return self.sources.get(name, name)

    def as_dict(self, redact: bool = True) -> dict[str, Any]:
        """The resolved options as plain JSON-able values; secrets replaced by ``***``."""
        resolved: dict[str, Any] = {k: v for section in self.sections() for k, v in dataclasses.asdict(section).items()}
        resolved.update(_jsonable(self.training.to_dict()))
        resolved["push_to_hub"] = self.push_to_hub
        resolved["output_store"] = without_credentials(self.output_store) if self.output_store else None
        if redact:
            for name in SECRET_FIELDS:
                if resolved.get(name):
                    resolved[name] = REDACTED
        return resolved


def move_hub_token_to_env(config: Config, environ: MutableMapping[str, str]) -> None:
    """Keep a hub token out of every file: the Trainer pickles its arguments into each checkpoint's and the final
    model's training_args.bin (mode 0644). The token moves to ``HF_TOKEN`` in this process's environment, where
    huggingface_hub (and the Trainer's push) read it, and the argument is cleared."""
    token = config.training.hub_token
    if token:
        environ.setdefault("HF_TOKEN", token)
        config.training.hub_token = None


def _jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)):
            out[key] = [v if isinstance(v, (str, int, float, bool)) else str(v) for v in value]
        elif isinstance(value, dict):
            out[key] = _jsonable(value)
        else:
            out[key] = str(getattr(value, "value", value))
    return out
