"""The schema as one ``HfArgumentParser``: every option's flag, type, choices, default and help.

argparse does every string-to-type conversion for every layer (``parse_dict`` would convert nothing), so the
YAML and environment layers are turned into flags and read by this parser too (train.config.layers).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from types import MappingProxyType
from typing import Any

from transformers import HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

from train.borrowed.stdlib import argparse_actions
from train.borrowed.transformers_args import FieldHookParser
from train.common.errors import ConfigError
from train.config.bounds import BOUND, SHOWN_CHARS, help_with
from train.config.schema import PROJECT_DEFAULTS, TRAINING_BOUNDS
from train.config.sections import SECTIONS

TOKENS_SEEN_MODES = ("all", "non_padding", "no")


class _SchemaParser(FieldHookParser):
    """HfArgumentParser that raises instead of exiting, and reads our fields' bounds out of their metadata."""

    def error(self, message: str) -> None:
        # argparse exits on errors; we raise so the message can name its source and main() decides.
        raise ConfigError(message if len(message) <= 4 * SHOWN_CHARS else message[: 4 * SHOWN_CHARS] + "…")

    @staticmethod
    def argparse_field(field: dataclasses.Field[Any]) -> dataclasses.Field[Any]:
        # transformers 5.25 passes every metadata key to add_argument, which refuses a "bound": hand it a copy of
        # the field without one (the class keeps its own, for validation).
        if BOUND in field.metadata:
            field = copy.copy(field)
            field.metadata = MappingProxyType({k: v for k, v in field.metadata.items() if k != BOUND})
        return field


def tokens_seen_mode(value: str) -> str:
    """``include_num_input_tokens_seen`` read as TrainingArguments.__post_init__ reads it: all, non_padding or no,
    a boolean meaning all or no. The field is typed ``str | bool``, which HfArgumentParser turns into a bool
    option, so ``non_padding`` could not be given at all (transformers 5.25: "Truthy value expected")."""
    lowered = value.lower()
    if lowered in TOKENS_SEEN_MODES:
        return lowered
    try:
        return "all" if string_to_bool(lowered) else "no"
    except argparse.ArgumentTypeError:
        raise ValueError(value) from None


def build_parser() -> HfArgumentParser:
    """The parser of every option, our defaults set, each TrainingArguments bound said in its help."""
    parser = _SchemaParser((*(section for _, section in SECTIONS), TrainingArguments), allow_abbrev=False)
    for action in argparse_actions(parser):
        if action.dest == "include_num_input_tokens_seen":
            action.type, action.const, action.choices = tokens_seen_mode, "all", TOKENS_SEEN_MODES
        if action.dest in TRAINING_BOUNDS and action.help:
            action.help = help_with(action.help, TRAINING_BOUNDS[action.dest])
    parser.set_defaults(**PROJECT_DEFAULTS)
    return parser


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option by field name (the ``--no_*`` negations argparse adds for bools are left out)."""
    actions: dict[str, argparse.Action] = {}
    for action in argparse_actions(parser):
        if action.dest == "help" or not action.option_strings:
            continue
        if any(s.startswith("--no_") for s in action.option_strings) and action.dest in actions:
            continue
        actions.setdefault(action.dest, action)
    return actions


def expected_type(action: argparse.Action) -> str:
    """What an option's type accepts, as an error says it: ``expected an integer``."""
    if action.choices:
        return "one of " + ", ".join(str(c) for c in action.choices)
    kind = getattr(action.type, "__name__", "")
    return {
        "int": "an integer",
        "float": "a number",
        "string_to_bool": "true or false",
    }.get(kind, f"a value of type {kind or 'string'}")
