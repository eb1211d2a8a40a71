"""The schema: our defaults, each field's bound kept with it, and help texts that say the bound in its own words."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import TrainingArguments

from train.config import (
    BOUNDS,
    JOB_FIELDS,
    MAX_PROCESSES,
    MAX_RESTARTS,
    PROJECT_DEFAULTS,
    SECTIONS,
    TRAINING_BOUNDS,
    DataArguments,
    LaunchArguments,
    build_parser,
    env_name,
    load_config,
    option_actions,
)
from train.config.schema import BOUND


def test_defaults_are_ours() -> None:
    config = load_config([], {})
    assert config.model.model_name_or_path == "distilbert-base-uncased"
    assert config.data.padding == "dynamic"
    assert config.data.max_seq_length == 128
    assert config.masking.mlm_probability == 0.15
    assert config.data.demo_samples == 50000
    assert config.training.output_dir == "./output"
    assert config.training.per_device_train_batch_size == 32
    assert config.sources == {}


def test_every_project_default_is_a_trainer_field_and_applies() -> None:
    trainer_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(PROJECT_DEFAULTS) <= trainer_fields
    training = load_config([], {}).training
    assert (training.seed, training.logging_steps, training.dataloader_num_workers) == (42, 50, 2)


def test_every_trainer_bound_names_a_trainer_field() -> None:
    """A bound on a name the Trainer no longer has would silently check nothing."""
    assert set(TRAINING_BOUNDS) <= {f.name for f in dataclasses.fields(TrainingArguments)}
    assert not set(TRAINING_BOUNDS) & set(JOB_FIELDS)


def test_job_bounds_live_on_their_fields() -> None:
    fields = {f.name: f for _, section in SECTIONS for f in dataclasses.fields(section)}
    assert fields["max_seq_length"].metadata[BOUND] is BOUNDS["max_seq_length"]
    assert BOUNDS["max_seq_length"].accepts(8) and not BOUNDS["max_seq_length"].accepts(7)
    assert fields["tokenizer_name"].metadata[BOUND] is None and "tokenizer_name" not in BOUNDS
    assert JOB_FIELDS == tuple(fields)


def test_every_bound_is_said_once_at_the_end_of_its_help() -> None:
    """The help's range phrase is the bound's own words, so the two cannot disagree (it said 'at least 8')."""
    actions = option_actions(build_parser())
    shown_in_help = [name for name, bound in BOUNDS.items() if bound.in_help]
    assert {"max_seq_length", "mlm_probability", "nproc_per_node", "seed", "num_train_epochs"} <= set(shown_in_help)
    for name in shown_in_help:
        text, sep, said = actions[name].help.rpartition(" Accepts ")
        assert sep and said == f"{BOUNDS[name].expected}.", name
        assert " Accepts " not in text, name
    assert (
        actions["max_seq_length"].help
        == "Longest sequence in tokens (longer text is cut). Accepts an integer from 8 to 1048576."
    )
    assert actions["tokenizer_name"].help.endswith("trained on the training text.")  # unbounded: as written


def test_a_bound_that_only_refuses_blanks_is_not_restated() -> None:
    actions = option_actions(build_parser())
    assert not BOUNDS["dataset"].in_help and "Accepts" not in actions["dataset"].help


def test_the_dataclass_keeps_plain_defaults() -> None:
    """Other modules and tests read defaults off the class (LaunchArguments.stop_timeout)."""
    assert LaunchArguments.stop_timeout == 270 and DataArguments().max_seq_length == 128


@pytest.mark.parametrize(("name", "var"), [("seed", "MLM_SEED"), ("max_seq_length", "MLM_MAX_SEQ_LENGTH")])
def test_env_names_are_derived_from_field_names(name: str, var: str) -> None:
    assert env_name(name) == var


def test_limits_are_importable_from_the_package() -> None:
    """The launcher bounds PET_NPROC_PER_NODE and PET_MAX_RESTARTS with the same limits as MLM_*."""
    assert MAX_PROCESSES == 1024 and MAX_RESTARTS == 1000
    assert BOUNDS["max_restarts"].accepts(MAX_RESTARTS) and not BOUNDS["max_restarts"].accepts(MAX_RESTARTS + 1)
    assert BOUNDS["nproc_per_node"].accepts(str(MAX_PROCESSES))
    assert not BOUNDS["nproc_per_node"].accepts(str(MAX_PROCESSES + 1))


def test_every_option_is_in_one_section_and_keeps_its_flat_name(tmp_path: Path) -> None:
    """Sections are ours to cut: an option's variable, YAML key and flag stay its name alone, and no name is in two
    sections or in the Trainer's arguments too (HfArgumentParser would refuse the second flag)."""
    names = [f.name for _, section in SECTIONS for f in dataclasses.fields(section)]
    assert len(names) == len(set(names)) and not set(names) & {f.name for f in dataclasses.fields(TrainingArguments)}
    yaml = tmp_path / "job.yaml"
    yaml.write_text("padding: packed\n")
    config = load_config(["--config", str(yaml), "--stop_timeout", "100"], {"MLM_MLM_PROBABILITY": "0.2"})
    assert (config.data.padding, config.launch.stop_timeout, config.masking.mlm_probability) == ("packed", 100, 0.2)
    assert [type(part) for part in config.sections()] == [section for _, section in SECTIONS]


def test_a_section_names_its_options_as_the_user_set_them() -> None:
    """A function handed one section says where a value came from as the Config does (its errors name MLM_*)."""
    config = load_config(["--max_seq_length", "64"], {"MLM_DATASET": "demo"})
    assert (config.data.source_of("dataset"), config.data.source_of("max_seq_length")) == (
        "MLM_DATASET",
        "--max_seq_length",
    )
    assert config.masking.source_of("mlm_probability") == "mlm_probability"  # a default: its name
    assert config.option("max_seq_length") == 64 and config.option("seed") == config.training.seed


def test_a_sections_copy_still_names_its_options_as_the_user_set_them() -> None:
    """A mixture reads each source as the data section with that dataset alone: its errors still say MLM_*."""
    data = load_config([], {"MLM_VALIDATION_SPLIT_PERCENTAGE": "0"}).data
    alone = data.but(dataset="news.txt")
    assert (alone.dataset, data.dataset) == ("news.txt", "demo")
    assert alone.source_of("validation_split_percentage") == "MLM_VALIDATION_SPLIT_PERCENTAGE"
