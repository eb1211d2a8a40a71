"""The one configuration schema and its precedence.

Every option is a typed dataclass field: :class:`JobArguments` (ours) plus every field of
``transformers.TrainingArguments``. Each is settable four ways, later ones winning:

    defaults  <  YAML file (MLM_CONFIG=path or --config path)  <  environment (MLM_<FIELD>)  <  CLI (--field)

All layers are turned into one argv list and parsed by ``HfArgumentParser``, so argparse does every
string-to-type conversion (``parse_dict`` would not). Before that, each value is checked on its own so an error
names where it came from (``MLM_NUM_TRAIN_EPOCHS``, ``job.yaml: num_train_epochs``, ``--num_train_epochs``), and
:func:`validate` checks the ranges on the parsed values before ``TrainingArguments`` sees them. Unknown keys, and a
key given twice in one YAML mapping, are errors; an unknown one names the nearest real option.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from transformers import HfArgumentParser, TrainingArguments

from train.errors import ConfigError

ENV_PREFIX = "MLM_"
# MLM_* variables that are not options: read by entrypoint.sh / the launcher / logging, documented in the README.
NON_OPTION_ENV = {"MLM_CONFIG", "MLM_DEBUG", "MLM_EXIT_DIR", "MLM_LAUNCH", "MLM_PYTHON"}
REDACTED = "***"
SECRET_FIELDS = {"hub_token"}

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


@dataclass
class JobArguments:
    """The job's own options (the TrainingArguments fields follow them in the schema)."""

    model_name_or_path: str = field(
        default="distilbert-base-uncased",
        metadata={
            "help": "Hub id or local directory of a pretrained model; or an architecture to train from scratch: "
            "a config.json path or scratch:<model_type> (e.g. scratch:distilbert)."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Model config overrides when training from scratch, e.g. n_layers=2,dim=128,hidden_dim=512."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local directory of the tokenizer. Default: the model's; from scratch without one, "
            "a WordPiece tokenizer is trained on the training text."
        },
    )
    tokenizer_vocab_size: int = field(
        default=30522, metadata={"help": "Vocabulary size of a tokenizer trained on the training text."}
    )
    dataset: str = field(
        default="demo",
        metadata={
            "help": "demo (the seed's data); a local .txt/.jsonl/.json/.csv/.parquet file, a directory of them or "
            "one written by datasets.save_to_disk; or a hub dataset id."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Config name of a hub dataset."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Evaluation data file; default: a split of the training data."}
    )
    validation_split_percentage: int = field(
        default=20,
        metadata={"help": "Percent of the training data held out for evaluation when there is no validation data."},
    )
    max_seq_length: int = field(
        default=128, metadata={"help": "Longest sequence in tokens (longer text is cut); at least 8."}
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens masked, in (0, 1)."})
    padding: Literal["dynamic", "max_length", "packed"] = field(
        default="dynamic",
        metadata={
            "help": "dynamic: pad to the longest in the batch (multiple of 8); max_length: pad all to "
            "max_seq_length (the seed's way); packed: concatenate and cut into full max_seq_length blocks."
        },
    )
    pad_to_multiple_of: int = field(
        default=8, metadata={"help": "Dynamic padding rounds lengths up to this (at most max_seq_length)."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization (default: one)."}
    )
    demo_samples: int = field(default=50000, metadata={"help": "Number of samples of the demo dataset."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use at most this many training samples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use at most this many evaluation samples."})
    masked_only_head: bool = field(
        default=True,
        metadata={
            "help": "Compute the vocabulary projection only at masked positions while training (same loss, less "
            "compute; DistilBERT and BERT, other models keep the dense head); the saved model is unchanged."
        },
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model/tokenizer code from the hub to run. Off unless set."}
    )
    resume: str = field(
        default="auto",
        metadata={"help": "auto: continue from the newest complete checkpoint in output_dir; never; or a path."},
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a finished final/ in output_dir (otherwise the job refuses)."}
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Samples per optimizer step across all ranks; gradient accumulation is derived from it "
            "and the world size."
        },
    )
    nproc_per_node: str | None = field(
        default=None,
        metadata={
            "help": "Processes per node: a number, auto (the default: the visible GPUs, or 1 on CPU), gpu (the "
            "visible GPUs; an error without one) or cpu (one per CPU core)."
        },
    )
    require_gpu: bool = field(default=False, metadata={"help": "Fail (exit 3) instead of falling back to the CPU."})
    log_ranks: str = field(default="0", metadata={"help": "Local ranks whose output is shown (e.g. 0 or 0,1), or all."})
    log_format: Literal["auto", "text", "json"] = field(
        default="auto", metadata={"help": "auto: text on a terminal, JSON lines otherwise."}
    )
    max_restarts: int = field(default=0, metadata={"help": "torchrun restarts of a failed rank group."})
    rdzv_timeout: int = field(default=900, metadata={"help": "Seconds to wait for all nodes at rendezvous."})
    stop_timeout: int = field(
        default=270,
        metadata={
            "help": "Seconds the ranks get, after SIGTERM/SIGINT/SIGUSR1/SIGUSR2, to save a checkpoint before "
            "torchrun kills them; keep it below the grace period (Kubernetes terminationGracePeriodSeconds 300, "
            "compose stop_grace_period 300s) and above the time a checkpoint takes to write."
        },
    )
    image_revision: str | None = field(default=None, metadata={"help": "Source revision of the image (set by it)."})


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
    "report_to": ["none"],
    "optim": "adamw_torch_fused",
    "dataloader_num_workers": 2,
    # The collator needs each sample's index to make masking a pure function of (seed, epoch, index).
    "remove_unused_columns": False,
    # Masked LMs use every parameter in every step; searching for unused ones costs a graph traversal per step.
    "ddp_find_unused_parameters": False,
    "seed": 42,
}


@dataclass
class Config:
    """The resolved configuration, and where each non-default value came from."""

    job: JobArguments
    training: TrainingArguments
    sources: dict[str, str]

    def source_of(self, name: str) -> str:
        return self.sources.get(name, name)

    def as_dict(self, redact: bool = True) -> dict[str, Any]:
        """The resolved options as plain JSON-able values; secrets replaced by ``***``."""
        resolved: dict[str, Any] = dataclasses.asdict(self.job)
        resolved.update(_jsonable(self.training.to_dict()))
        if redact:
            for name in SECRET_FIELDS:
                if resolved.get(name):
                    resolved[name] = REDACTED
        return resolved


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


class _RaisingParser(HfArgumentParser):
    """argparse exits on errors; we raise so the message can name its source and main() decides."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message if len(message) <= 4 * SHOWN_CHARS else message[: 4 * SHOWN_CHARS] + "…")


def build_parser() -> HfArgumentParser:
    parser = _RaisingParser((JobArguments, TrainingArguments), allow_abbrev=False)
    parser.set_defaults(**PROJECT_DEFAULTS)
    return parser


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option by field name (the ``--no_*`` negations argparse adds for bools are left out)."""
    actions = {}
    for action in parser._actions:
        if action.dest == "help" or not action.option_strings:
            continue
        if any(s.startswith("--no_") for s in action.option_strings) and action.dest in actions:
            continue
        actions.setdefault(action.dest, action)
    return actions


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def shown(value: Any) -> str:
    """A value as an error message echoes it: its repr, cut to SHOWN_CHARS characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


def _nearest(name: str, known: Sequence[str]) -> str:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f"; did you mean {match[0]}?" if match else ""


def _expected(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(str(c) for c in action.choices)
    kind = getattr(action.type, "__name__", "")
    return {
        "int": "an integer",
        "float": "a number",
        "string_to_bool": "true or false",
    }.get(kind, f"a value of type {kind or 'string'}")


def _yaml_strings(value: Any) -> list[str]:
    """A YAML value as the strings argparse would get on a command line."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if isinstance(value, dict):
        import json

        return [json.dumps(value)]
    return [str(value)]


def _takes_list(action: argparse.Action) -> bool:
    return action.nargs in ("+", "*")


def _to_args(name: str, action: argparse.Action, values: list[str]) -> list[str]:
    """``--name=value`` for a single value, so that one starting with ``-`` (``-inf``, ``-1e-5``) is no flag."""
    return [f"--{name}", *values] if _takes_list(action) else [f"--{name}={value}" for value in values]


def _check_value(action: argparse.Action, source: str, values: list[str]) -> None:
    """Convert one option's raw strings the way argparse will, failing with a message naming the source."""
    if len(values) > 1 and not _takes_list(action):
        raise ConfigError(f"{source}={shown(' '.join(values))}: expected one value, {_expected(action)}")
    for raw in values:
        try:
            converted = action.type(raw) if action.type else raw
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise ConfigError(f"{source}={shown(raw)}: expected {_expected(action)}") from None
        if action.choices and converted not in action.choices:
            raise ConfigError(f"{source}={shown(raw)}: expected {_expected(action)}")


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error (safe_load keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # keys merged in with << may be overridden: that is what merging is for
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"MLM_CONFIG/--config: no such file {path!r}; expected a YAML file of options")
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{path}: {shown(exc.key)} is set twice (lines {exc.first} and {exc.second}); expected each key once"
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError, OSError, ValueError) as exc:  # ValueError: an int of 4300+ digits
        first = (str(exc).splitlines() or [type(exc).__name__])[0][: 2 * SHOWN_CHARS]
        raise ConfigError(f"{path}: not valid YAML ({first}); expected a mapping of option: value") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option: value, got {type(data).__name__}")
    return data


def _split_config_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take ``--config PATH`` / ``--config=PATH`` out of argv (it selects the YAML layer; it is no option)."""
    rest: list[str] = []
    path = None
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            path = next(it, None)
            if path is None:
                raise ConfigError("--config: expected a path to a YAML file")
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve the configuration: defaults < YAML < environment < CLI. Raises ConfigError on bad input."""
    environ = os.environ if environ is None else environ
    argv = list(argv or [])
    parser = build_parser()
    actions = option_actions(parser)
    known = sorted(actions)

    cli_config, cli_args = _split_config_flag(argv)
    yaml_path = cli_config or environ.get("MLM_CONFIG") or None

    layered: list[str] = []
    sources: dict[str, str] = {}

    if yaml_path:
        for key, value in read_yaml(yaml_path).items():
            key = str(key)
            if key not in actions:
                raise ConfigError(f"{yaml_path}: unknown option {shown(key)}{_nearest(key, known)}")
            if value is None:
                continue
            values = _yaml_strings(value)
            source = f"{yaml_path}: {key}"
            _check_value(actions[key], source, values)
            layered += _to_args(key, actions[key], values)
            sources[key] = source

    env_known = [env_name(n) for n in known]
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in NON_OPTION_ENV:
            continue
        name = var[len(ENV_PREFIX) :].lower()
        if name not in actions:
            raise ConfigError(f"{var}: unknown option{_nearest(var, env_known)}")
        value = environ[var]
        action = actions[name]
        values = value.split(",") if _takes_list(action) else [value]
        _check_value(action, var, values)
        layered += _to_args(name, action, values)
        sources[name] = var

    # CLI flags: an unknown one is an error naming the nearest real option; values are checked like the others.
    for flag, values in _cli_flags(cli_args):
        name = flag[2:]
        if name not in actions and not (name.startswith("no_") and name[3:] in actions):
            raise ConfigError(f"{flag}: unknown option{_nearest(name, known)}")
        if name in actions:
            _check_value(actions[name], flag, values)
        sources[name.removeprefix("no_") if name not in actions else name] = flag

    full_argv = layered + cli_args
    # The values are checked before TrainingArguments.__post_init__ sees them: it crashes on some (an infinite
    # logging_steps) and rejects others without saying where they came from.
    namespace, _ = parser.parse_known_args(args=full_argv)
    validate(vars(namespace), sources)
    try:
        job, training = parser.parse_args_into_dataclasses(args=full_argv, look_for_args_file=False)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # TrainingArguments.__post_init__ rejects combinations
        raise ConfigError(" ".join(str(exc).split())) from None
    return Config(job=job, training=training, sources=sources)


def _cli_flags(cli_args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``(--flag, [values])`` for each flag: ``--flag=value``, or the arguments up to the next ``--`` flag."""
    flags: list[tuple[str, list[str]]] = []
    for arg in cli_args:
        if arg.startswith("--"):
            flag, sep, value = arg.partition("=")
            flags.append((flag, [value] if sep else []))
        elif flags:
            flags[-1][1].append(arg)
    return flags


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


def option_rows(parser: HfArgumentParser | None = None, job_only: bool = False) -> list[tuple[str, str, str, str]]:
    """(name, env var, default, help) for each option: the source of the README's table."""
    parser = parser or build_parser()
    job_fields = {f.name for f in dataclasses.fields(JobArguments)}
    rows = []
    for name, action in option_actions(parser).items():
        if job_only and name not in job_fields and name not in PROJECT_DEFAULTS:
            continue
        default = action.default
        if isinstance(default, list):
            default = ",".join(str(d) for d in default)
        default_text = "" if default is None else str(getattr(default, "value", default))
        help_text = " ".join((action.help or "").split())
        rows.append((name, env_name(name), default_text, help_text))
    return rows
