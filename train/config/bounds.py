"""What values an option accepts, stated once: a :class:`Bound` is the check and the words for it.

The words serve twice, so they cannot disagree with the check or with each other: an error says ``expected
<words>`` and the option's help says ``Accepts <words>.`` (:func:`help_with`). The limits themselves are the
constants below; other modules import them from ``train.config`` (the launcher bounds ``PET_*`` with the same ones).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self

from train.common import durations

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
NPROC_WORDS = ("auto", "gpu", "cpu")  # launch.decide.decide_nproc's meanings
DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes '²', int() takes Arabic-Indic digits
OVERRIDE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^=,]+)")


BOUND = "bound"  # the metadata key of a field's Bound (the parser takes it out: argparse would refuse it)


def shown(value: Any) -> str:
    """A value as an error message echoes it: its repr, cut to SHOWN_CHARS characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


@dataclass(frozen=True)
class Bound:
    """The values one option accepts (an unset optional option, None, is not checked; a list's items are)."""

    accepts: Callable[[Any], bool]
    expected: str  # "expected <this>" in the error, "Accepts <this>." in the help
    # False where the help text already names every accepted form and the check only refuses a blank value.
    in_help: bool = True


def help_with(text: str, bound: Bound | None) -> str:
    """An option's help text with its bound said at the end: the one way a range reaches the help."""
    if bound is None or not bound.in_help:
        return text
    text = text.strip()
    return f"{text}{'' if text.endswith('.') else '.'} Accepts {bound.expected}."


def integers(low: int, high: int | None = None, note: str = "") -> Bound:
    """Integers from ``low`` (to ``high``, when given); ``note`` follows the range in the words."""
    if high is None:
        words = "a positive integer" if low == 1 else f"an integer >= {low}"
        return Bound(lambda v: v >= low, words + note)
    return Bound(lambda v: low <= v <= high, f"an integer from {low} to {high}{note}")


def _whole_steps(value: float) -> bool:
    return 1 <= value <= INT64[1] and float(value).is_integer()


def steps(zero: bool = False) -> Bound:
    """A step count as TrainingArguments reads it: a whole number, or below 1 a fraction of the training steps."""
    words = f"a whole number of steps, or a fraction in {'[0' if zero else '(0'}, 1) of the training steps"
    if zero:
        return Bound(lambda v: 0 <= v < 1 or _whole_steps(v), words)
    return Bound(lambda v: 0 < v < 1 or _whole_steps(v), words)


POSITIVE = Bound(lambda v: v > 0, "a positive number")
NON_NEGATIVE = Bound(lambda v: v >= 0, "a number >= 0")
FRACTION = Bound(lambda v: 0 <= v < 1, "a number in [0, 1)")
PROBABILITY = Bound(lambda v: 0 <= v <= 1, "a number from 0 to 1")
OPEN_FRACTION = Bound(lambda v: 0 < v < 1, "a number between 0 and 1 (exclusive)")
SEED = Bound(lambda v: 0 <= v <= SEED_MAX, "an integer from 0 to 2**32 - 1")


def non_blank(expected: str) -> Bound:
    """A name that must say something (the help lists its forms, so it is not restated there)."""
    return Bound(lambda v: bool(v.strip()), expected, in_help=False)


def _processes(value: str) -> bool:
    text = value.strip()
    return text.lower() in NPROC_WORDS or (DIGITS.fullmatch(text) is not None and 1 <= int(text) <= MAX_PROCESSES)


def _local_ranks(value: str) -> bool:
    if value.strip() == "all":
        return True
    ranks = [part.strip() for part in value.split(",")]
    distinct = len(set(ranks)) == len(ranks)
    return distinct and all(DIGITS.fullmatch(r) is not None and int(r) < MAX_PROCESSES for r in ranks)


def _overrides(value: str) -> bool:
    if not value:  # an empty MLM_CONFIG_OVERRIDES (compose's ${VAR:-}) means none
        return True
    if value.lstrip().startswith("{"):  # a JSON object: what a YAML mapping of config_overrides becomes
        try:
            return isinstance(json.loads(value), dict)
        except ValueError:
            return False
    pairs = [OVERRIDE.fullmatch(item) for item in value.split(",")]
    keys = [pair.group(1) for pair in pairs if pair]
    return all(pairs) and len(set(keys)) == len(keys)


DURATION = Bound(
    lambda v: (
        v.strip().lower() == durations.SCHEDULER or durations.seconds(v) is not None or durations.until(v) is not None
    ),
    durations.EXPECTED,
)
PROCESSES = Bound(_processes, f"a positive integer up to {MAX_PROCESSES}, auto, gpu or cpu")
LOCAL_RANKS = Bound(_local_ranks, f"distinct local ranks from 0 to {MAX_PROCESSES - 1} (e.g. 0 or 0,1), or all")
OVERRIDES = Bound(
    _overrides,
    "comma-separated key=value pairs, each key once (e.g. n_layers=2,dim=128), or a JSON object (in YAML a mapping)",
)


# 0 epochs is what TrainingArguments reads when max_steps decides the length (validate checks the pair); a
# negative count is an error whatever else is set.
EPOCHS = Bound(lambda v: v >= 0, "a positive number (or 0 with max_steps)")
# The bounds of TrainingArguments fields the types alone do not express. Beyond these, every float must be finite
# and every integer must fit 64 bits (train.config.validate): no TrainingArguments field documents inf or nan
# (trainer.py passes inf to clip_grad_norm_ internally to mean "no clipping"; the documented way to turn clipping
# off is max_grad_norm=0).
TRAINING_BOUNDS: Mapping[str, Bound] = MappingProxyType(
    {
        "num_train_epochs": EPOCHS,
        "per_device_train_batch_size": integers(1),
        "per_device_eval_batch_size": integers(1),
        "gradient_accumulation_steps": integers(1),
        "eval_accumulation_steps": integers(1),
        "torch_empty_cache_steps": integers(1),
        "dataloader_prefetch_factor": integers(1),
        "ddp_bucket_cap_mb": integers(1),
        "max_steps": Bound(lambda v: v == -1 or v >= 1, "a positive integer, or -1 to train num_train_epochs"),
        "save_total_limit": integers(0, note=" (0 keeps every checkpoint)"),
        "seed": SEED,
        "data_seed": SEED,
        "dataloader_num_workers": integers(0, MAX_PROCESSES),
        "ddp_timeout": integers(1, MAX_TIMEOUT_S, " seconds"),
        "learning_rate": POSITIVE,
        "weight_decay": NON_NEGATIVE,
        "adam_beta1": FRACTION,
        "adam_beta2": FRACTION,
        "adam_epsilon": POSITIVE,
        "max_grad_norm": Bound(NON_NEGATIVE.accepts, "a number >= 0 (0 turns clipping off)"),
        "label_smoothing_factor": FRACTION,
        "neftune_noise_alpha": POSITIVE,
        "warmup_steps": steps(zero=True),
        "logging_steps": steps(),
        "eval_steps": steps(),
        "save_steps": steps(),
        "eval_delay": NON_NEGATIVE,
    }
)


def option(default: Any, help: str, bound: Bound | None = None) -> Any:
    """A field's default, help and bound together; the help it shows ends with the bound's words."""
    return field(default=default, metadata={"help": help_with(help, bound), BOUND: bound})


@dataclass
class Section:
    """A section of the options. It knows where each option was set (``sources``: the resolved configuration's
    map, given once it is resolved), so that a function handed the section alone names the option in its errors
    as the user set it (``MLM_SEED``, ``job.yaml: seed``, ``--seed``)."""

    def __post_init__(self) -> None:
        self.sources: Mapping[str, str] = {}

    def source_of(self, name: str) -> str:
        """Where an option was set, as errors name it, else its name."""
        return self.sources.get(name, name)

    def but(self, **changes: Any) -> Self:
        """A copy with ``changes``, still knowing where each option was set (``dataclasses.replace`` makes the
        section anew, whose map starts empty: its errors would name a bare option)."""
        changed = dataclasses.replace(self, **changes)
        changed.sources = self.sources
        return changed
