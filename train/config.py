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
import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from transformers import HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

from train.errors import ConfigError
from train.validate import SHOWN_CHARS, shown, validate

ENV_PREFIX = "MLM_"
# MLM_* variables that are not options: read by entrypoint.sh / the launcher / logging, documented in the README.
NON_OPTION_ENV = {"MLM_CONFIG", "MLM_DEBUG", "MLM_EXIT_DIR", "MLM_LAUNCH", "MLM_PYTHON"}
REDACTED = "***"
SECRET_FIELDS = {"hub_token"}


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
            "help": "demo (the seed's data); a .txt/.jsonl/.json/.csv/.parquet file (text formats also .gz, .bz2, "
            ".xz, .zst), a directory or glob of them, local or remote (s3://, gs://, hf://, https://), or a local "
            "directory written by datasets.save_to_disk; or a hub dataset id."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Config name of a hub dataset."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    validation_file: str | None = field(
        default=None,
        metadata={
            "help": "Evaluation data (a file, directory or glob, local or remote); default: a split of the "
            "training data."
        },
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
            "help": "dynamic: pad to the longest in the batch (on GPU a multiple of 8); max_length: pad all to "
            "max_seq_length (the seed's way); packed: concatenate and cut into full max_seq_length blocks."
        },
    )
    pad_to_multiple_of: int = field(
        default=8,
        metadata={
            "help": "Dynamic padding rounds lengths up to this (at most max_seq_length); for tensor cores, so "
            "the launcher makes it 1 on CPU unless set."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes for tokenization (default: one per CPU this container may use, cgroup quota "
            "included, when each gets 20,000 rows or more; else one)."
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read, tokenize and pack the corpus on the fly while training, each rank its own part, with no "
            "cache (corpora too large for the disk or to tokenize first); needs max_steps, and max_eval_samples or "
            "validation_file to evaluate."
        },
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
        default=False,
        metadata={
            "help": "Start over on an output_dir holding a finished final/ (otherwise the job refuses): its "
            "checkpoints are removed and final/ is replaced when this run ends (kept as final.previous/ until then)."
        },
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
    "seed": 42,
}


@dataclass
class Config:
    """The resolved configuration, and where each non-default value came from."""

    job: JobArguments
    training: TrainingArguments
    sources: dict[str, str]
    # MLM_PUSH_TO_HUB as the user set it: the job pushes final/, the Trainer is told not to (see take_over_push).
    push_to_hub: bool = False

    def source_of(self, name: str) -> str:
        return self.sources.get(name, name)

    def as_dict(self, redact: bool = True) -> dict[str, Any]:
        """The resolved options as plain JSON-able values; secrets replaced by ``***``."""
        resolved: dict[str, Any] = dataclasses.asdict(self.job)
        resolved.update(_jsonable(self.training.to_dict()))
        resolved["push_to_hub"] = self.push_to_hub
        if redact:
            for name in SECRET_FIELDS:
                if resolved.get(name):
                    resolved[name] = REDACTED
        return resolved


def withhold_secrets(config: Config, environ: MutableMapping[str, str]) -> None:
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


class _RaisingParser(HfArgumentParser):
    """argparse exits on errors; we raise so the message can name its source and main() decides."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message if len(message) <= 4 * SHOWN_CHARS else message[: 4 * SHOWN_CHARS] + "…")


TOKENS_SEEN_MODES = ("all", "non_padding", "no")


def tokens_seen_mode(value: str) -> str:
    """``include_num_input_tokens_seen`` read as TrainingArguments.__post_init__ reads it: all, non_padding or no,
    a boolean meaning all or no. The field is typed ``str | bool``, which HfArgumentParser turns into a bool
    option, so ``non_padding`` could not be given at all (transformers 5.24: "Truthy value expected")."""
    lowered = value.lower()
    if lowered in TOKENS_SEEN_MODES:
        return lowered
    try:
        return "all" if string_to_bool(lowered) else "no"
    except argparse.ArgumentTypeError:
        raise ValueError(value) from None


def build_parser() -> HfArgumentParser:
    parser = _RaisingParser((JobArguments, TrainingArguments), allow_abbrev=False)
    for action in parser._actions:
        if action.dest == "include_num_input_tokens_seen":
            action.type, action.const, action.choices = tokens_seen_mode, "all", TOKENS_SEEN_MODES
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
    config = Config(job=job, training=training, sources=sources)
    split_trackers(config)
    take_over_push(config, environ)
    return config


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


# ---- the hub push of final/, and the trackers ------------------------------------------------------------------------
# MLM_PUSH_TO_HUB, MLM_HUB_MODEL_ID and MLM_HUB_PRIVATE_REPO are TrainingArguments fields, but the Trainer's own push
# creates the repository when it is built and uploads output_dir (checkpoints, logs, training_args.bin) at every save.
# The job pushes final/ instead, once, from rank 0, after final/ and run.json are written (train/publish.py): the
# Trainer gets push_to_hub=False, Config.push_to_hub keeps the choice, and what the push needs is checked here, before
# any training, rather than after it.


def take_over_push(config: Config, environ: Mapping[str, str]) -> None:
    """Move MLM_PUSH_TO_HUB from the Trainer to the job, and fail early (ConfigError) when the push could not work:
    no repository id, an invalid one, offline mode, or no token where huggingface_hub looks for one."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from train.hf import hf_home, offline

    training = config.training
    config.push_to_hub, training.push_to_hub = bool(training.push_to_hub), False
    if not config.push_to_hub:
        return
    source, repo_id = config.source_of("push_to_hub"), training.hub_model_id
    if not repo_id:
        raise ConfigError(
            f"{source}=true: set MLM_HUB_MODEL_ID to the repository to push final/ to (e.g. your-name/mlm-model)"
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ConfigError(
            f"{config.source_of('hub_model_id')}={shown(repo_id)}: expected name or namespace/name, of letters, "
            "digits, '-', '_' and '.'"
        ) from None
    if offline(environ):
        raise ConfigError(
            f"{source}=true, but HF_HUB_OFFLINE is set: unset it (a push needs the hub), or turn {source} off"
        )
    token_file = environ.get("HF_TOKEN_PATH") or str(hf_home(environ) / "token")
    given = training.hub_token or environ.get("HF_TOKEN") or environ.get("HUGGING_FACE_HUB_TOKEN")
    if not (given or environ.get("HF_OIDC_RESOURCE") or Path(os.path.expanduser(token_file)).is_file()):
        raise ConfigError(
            f"{source}=true: no hub token; set HF_TOKEN (or HF_TOKEN_FILE, a file holding it, or HF_TOKEN_PATH, "
            f"huggingface_hub's token file, now {token_file}) to a token that can write to {repo_id}"
        )


def split_trackers(config: Config) -> None:
    """MLM_REPORT_TO=mlflow,wandb (YAML ``report_to: mlflow,wandb``) names two trackers. TrainingArguments.report_to
    is one string to argparse, so the list arrives whole, and the Trainer would look for a tracker called
    ``mlflow,wandb``: it is split here. (The Trainer checks the names; importing its list here would cost the
    launcher seconds.)"""
    training = config.training
    names = [name.strip() for entry in training.report_to or () for name in str(entry).split(",") if name.strip()]
    training.report_to = [] if names == ["none"] else names
