"""Range checks the types alone do not express, on the parsed option values, before TrainingArguments is built
(its ``__post_init__`` crashes on some, e.g. ``logging_steps=inf``, and its own errors cannot say where a value
came from). Every error names the value's source (``MLM_X``, ``file.yaml: x``, ``--x``) and what is expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from train.errors import ConfigError

# Bounds on values that would otherwise overflow or run away; each error message states the one that applies.
INT64 = (-(2**63), 2**63 - 1)  # every integer option: torch, numpy and Arrow hold them in 64 bits
SEED_MAX = 2**32 - 1  # transformers.set_seed seeds numpy's legacy generator, which takes 0 .. 2**32 - 1
# Below the tokenizer's special tokens ([CLS] ... [SEP]: 2, up to 4 for pair templates) truncation is silently
# skipped and sequences come out longer than max_seq_length; 8 leaves at least 4 maskable tokens per sequence,
# and is the default pad_to_multiple_of, which must not round a batch past max_seq_length.
MIN_SEQ_LENGTH = 8
MAX_SEQ_LENGTH = 2**20
MAX_PROCESSES = 1024  # processes per node, hence local ranks; tokenization and dataloader workers
MAX_DEMO_SAMPLES = 10_000_000
MAX_RESTARTS = 1000
MAX_TIMEOUT_S = 7 * 24 * 3600  # a week: rendezvous, collective and shutdown timeouts
SHOWN_CHARS = 60  # an error message echoes at most this much of a value


def shown(value: Any) -> str:
    """A value as an error message echoes it: its repr, cut to SHOWN_CHARS characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


Rule = tuple[Callable[[Any], bool], str]


def _ints(low: int, high: int | None = None, note: str = "") -> Rule:
    if high is None:
        return (lambda v: v >= low), ("a positive integer" if low == 1 else f"an integer >= {low}") + note
    return (lambda v: low <= v <= high), f"an integer from {low} to {high}{note}"


def _steps(v: float) -> bool:
    return 0 < v < 1 or (1 <= v <= INT64[1] and float(v).is_integer())


STEPS = "a whole number of steps, or a fraction in (0, 1) of the training steps"
SEED = (lambda v: 0 <= v <= SEED_MAX), "an integer from 0 to 2**32 - 1"
# One rule per numeric option (unset optional ones are not checked). Beyond these, every float must be finite
# and every integer must fit 64 bits: no TrainingArguments field documents inf or nan (trainer.py passes inf to
# clip_grad_norm_ internally to mean "no clipping"; the documented way to turn clipping off is max_grad_norm=0).
RULES: dict[str, Rule] = {
    "tokenizer_vocab_size": _ints(1),
    "validation_split_percentage": _ints(0, 99),
    "max_seq_length": _ints(MIN_SEQ_LENGTH, MAX_SEQ_LENGTH),
    "mlm_probability": ((lambda v: 0 < v < 1), "a number between 0 and 1 (exclusive)"),
    "pad_to_multiple_of": _ints(1),
    "preprocessing_num_workers": _ints(1, MAX_PROCESSES),
    "demo_samples": _ints(1, MAX_DEMO_SAMPLES),
    "max_train_samples": _ints(1),
    "max_eval_samples": _ints(1),
    "global_batch_size": _ints(1),
    "max_restarts": _ints(0, MAX_RESTARTS),
    "rdzv_timeout": _ints(1, MAX_TIMEOUT_S, " seconds"),
    "stop_timeout": _ints(1, MAX_TIMEOUT_S, " seconds"),
    "per_device_train_batch_size": _ints(1),
    "per_device_eval_batch_size": _ints(1),
    "gradient_accumulation_steps": _ints(1),
    "eval_accumulation_steps": _ints(1),
    "torch_empty_cache_steps": _ints(1),
    "dataloader_prefetch_factor": _ints(1),
    "ddp_bucket_cap_mb": _ints(1),
    "max_steps": ((lambda v: v == -1 or v >= 1), "a positive integer, or -1 to train num_train_epochs"),
    "save_total_limit": _ints(0, note=" (0 keeps every checkpoint)"),
    "seed": SEED,
    "data_seed": SEED,
    "dataloader_num_workers": _ints(0, MAX_PROCESSES),
    "ddp_timeout": _ints(1, MAX_TIMEOUT_S, " seconds"),
    "learning_rate": ((lambda v: v > 0), "a positive number"),
    "weight_decay": ((lambda v: v >= 0), "a number >= 0"),
    "adam_beta1": ((lambda v: 0 <= v < 1), "a number in [0, 1)"),
    "adam_beta2": ((lambda v: 0 <= v < 1), "a number in [0, 1)"),
    "adam_epsilon": ((lambda v: v > 0), "a positive number"),
    "max_grad_norm": ((lambda v: v >= 0), "a number >= 0 (0 turns clipping off)"),
    "label_smoothing_factor": ((lambda v: 0 <= v < 1), "a number in [0, 1)"),
    "neftune_noise_alpha": ((lambda v: v > 0), "a positive number"),
    "warmup_steps": ((lambda v: v == 0 or _steps(v)), STEPS.replace("(0, 1)", "[0, 1)")),
    "logging_steps": (_steps, STEPS),
    "eval_steps": (_steps, STEPS),
    "save_steps": (_steps, STEPS),
    "eval_delay": ((lambda v: v >= 0), "a number >= 0"),
}
NPROC_WORDS = ("auto", "gpu", "cpu")  # decide.decide_nproc's meanings
DIGITS = re.compile(r"[0-9]+")
OVERRIDE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^=,]+)")


def validate(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Range checks the types alone do not express, on the parsed option values (field name -> value); each
    error names where the value came from and echoes at most SHOWN_CHARS characters of it."""

    def fail(name: str, value: Any, expected: str) -> None:
        raise ConfigError(f"{sources.get(name, name)}={shown(value)}: expected {expected}")

    for name, value in values.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                fail(name, item, "a finite number")
            if name in RULES and item is not None and not RULES[name][0](item):
                fail(name, item, RULES[name][1])
            if isinstance(item, int) and not isinstance(item, bool) and not INT64[0] <= item <= INT64[1]:
                fail(name, item, "an integer from -2**63 to 2**63 - 1")

    if values["num_train_epochs"] <= 0 and values["max_steps"] < 1:
        fail("num_train_epochs", values["num_train_epochs"], "a positive number")
    if values["streaming"] and values["max_steps"] < 1:  # a stream has no length to derive the steps from
        fail("streaming", "true", "with max_steps, as a stream has no length to derive the steps from: set max_steps")
    if values["pad_to_multiple_of"] > values["max_seq_length"]:
        fail("pad_to_multiple_of", values["pad_to_multiple_of"], f"at most max_seq_length ({values['max_seq_length']})")
    nproc = values["nproc_per_node"]
    if nproc is not None and nproc.strip().lower() not in NPROC_WORDS:
        if not DIGITS.fullmatch(nproc.strip()) or not 1 <= int(nproc) <= MAX_PROCESSES:
            fail("nproc_per_node", nproc, f"a positive integer up to {MAX_PROCESSES}, auto, gpu or cpu")
    log_ranks = values["log_ranks"]
    if log_ranks.strip() != "all":
        ranks = [part.strip() for part in log_ranks.split(",")]
        if not all(DIGITS.fullmatch(r) and int(r) < MAX_PROCESSES for r in ranks) or len(set(ranks)) < len(ranks):
            fail("log_ranks", log_ranks, f"distinct local ranks from 0 to {MAX_PROCESSES - 1} (e.g. 0 or 0,1), or all")
    overrides = values["config_overrides"]
    if overrides:
        pairs = [OVERRIDE.fullmatch(item) for item in overrides.split(",")]
        keys = [pair.group(1) for pair in pairs if pair]
        if not all(pairs) or len(set(keys)) < len(keys):
            fail(
                "config_overrides",
                overrides,
                "comma-separated key=value pairs, each key once (e.g. n_layers=2,dim=128)",
            )
    for name, expected in (
        ("model_name_or_path", "a hub id, a local directory or scratch:<model_type>"),
        ("dataset", "demo, a local path or a hub dataset id"),
        ("resume", "auto, never or a checkpoint path"),
    ):
        if not values[name].strip():
            fail(name, values[name], expected)
