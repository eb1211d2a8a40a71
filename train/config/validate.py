"""The checks the types alone do not express, on the parsed option values, before TrainingArguments is built.

Its ``__post_init__`` crashes on some values (``logging_steps=inf``) and its own errors cannot say where a value
came from. Every error here names the value's source (``MLM_X``, ``file.yaml: x``, ``--x``), echoes at most
SHOWN_CHARS characters of it, and says what is expected: for one option, in its bound's words (the schema's); for
options that constrain each other, in the rules at the end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

from train.common.errors import ConfigError
from train.common.mixture import mixture_parts
from train.config.bounds import EPOCHS, INT64, shown
from train.config.schema import BOUNDS


def validate(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Check the parsed option values (field name -> value); raises ConfigError naming the first bad one."""

    def fail(name: str, value: Any, expected: str) -> NoReturn:
        raise ConfigError(f"{sources.get(name, name)}={shown(value)}: expected {expected}")

    for name, value in values.items():
        bound = BOUNDS.get(name)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                fail(name, item, "a finite number")
            if bound is not None and item is not None and not bound.accepts(item):
                fail(name, item, bound.expected)
            if isinstance(item, int) and not isinstance(item, bool) and not INT64[0] <= item <= INT64[1]:
                fail(name, item, "an integer from -2**63 to 2**63 - 1")

    # Options that constrain each other: a length in epochs or in steps, and what max_seq_length allows.
    if values["num_train_epochs"] <= 0 and values["max_steps"] < 1:
        fail("num_train_epochs", values["num_train_epochs"], EPOCHS.expected)
    if values["streaming"] and values["max_steps"] < 1:
        fail("streaming", "true", "with max_steps, as a stream has no length to derive the steps from: set max_steps")
    if values["mask_replace_prob"] + values["random_replace_prob"] > 1:
        expected = f"at most 1 - mask_replace_prob ({1 - values['mask_replace_prob']:g})"
        fail("random_replace_prob", values["random_replace_prob"], expected)
    if mixture_parts(values["dataset"], sources.get("dataset", "dataset")) is not None:
        mixed = f"unset with a mixture of datasets ({sources.get('dataset', 'dataset')})"
        if values["streaming"]:
            fail("streaming", "true", "false with a mixture of datasets: a mixture is read in memory (not streamed)")
        if values["validation_file"]:
            fail("validation_file", values["validation_file"], f"{mixed}: each source holds out its own part")
        if values["dataset_config_name"]:
            fail("dataset_config_name", values["dataset_config_name"], mixed)
    if values["pad_to_multiple_of"] > values["max_seq_length"]:
        fail("pad_to_multiple_of", values["pad_to_multiple_of"], f"at most max_seq_length ({values['max_seq_length']})")
    if values["inject_fault"] and values["push_to_hub"]:
        fail("inject_fault", values["inject_fault"], "unset with push_to_hub: a fault drill's model is not published")
