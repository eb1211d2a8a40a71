"""The schema as one HfArgumentParser: flags, our defaults, and the Trainer's token-count field made parseable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from train.common.errors import ConfigError
from train.config import (
    BOUNDS,
    SECTIONS,
    build_parser,
    expected_type,
    load_config,
    option_actions,
    tokens_seen_mode,
)
from train.config.schema import BOUND


def test_the_parser_is_built_from_fields_that_carry_bounds_and_leaves_them_there() -> None:
    """argparse refuses unknown keywords: the parser hands it each field without its bound, not the class's."""
    actions = option_actions(build_parser())
    assert actions["max_seq_length"].default == 128 and actions["seed"].default == 42
    fields = {f.name: f for _, section in SECTIONS for f in dataclasses.fields(section)}
    assert fields["max_seq_length"].metadata[BOUND] is BOUNDS["max_seq_length"]


def test_bool_negations_are_no_separate_option() -> None:
    actions = option_actions(build_parser())
    assert "--masked_only_head" in actions["masked_only_head"].option_strings


def test_argparse_errors_raise_instead_of_exiting() -> None:
    with pytest.raises(ConfigError, match="expected one argument"):
        build_parser().parse_args(["--seed"])


@pytest.mark.parametrize(
    ("name", "words"),
    [("seed", "an integer"), ("learning_rate", "a number"), ("fp16", "true or false"), ("padding", "one of dynamic")],
)
def test_expected_types_are_said_plainly(name: str, words: str) -> None:
    assert expected_type(option_actions(build_parser())[name]).startswith(words)


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, "non_padding"), ("non_padding", "non_padding"), ("ALL", "all"), ("no", "no"), ("true", "all"),
     ("false", "no"), ("0", "no")],
)  # fmt: skip
def test_real_tokens_are_counted_by_default_and_every_trainer_value_parses(given, expected, tmp_path: Path) -> None:
    """HfArgumentParser reads ``str | bool`` as a bool and rejected non_padding; ours takes what the Trainer takes."""
    env = {} if given is None else {"MLM_INCLUDE_NUM_INPUT_TOKENS_SEEN": given}
    assert load_config([], env).training.include_num_input_tokens_seen == expected
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"include_num_input_tokens_seen: {given or 'non_padding'}\n")
    assert load_config(["--config", str(config_file)], {}).training.include_num_input_tokens_seen == expected


def test_a_token_count_mode_that_does_not_exist_names_the_choices() -> None:
    with pytest.raises(ValueError):
        tokens_seen_mode("padding")
    with pytest.raises(ConfigError, match=r"MLM_INCLUDE_NUM_INPUT_TOKENS_SEEN='padding': expected one of all, non"):
        load_config([], {"MLM_INCLUDE_NUM_INPUT_TOKENS_SEEN": "padding"})
