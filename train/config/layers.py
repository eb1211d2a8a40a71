"""The layers of the configuration, one over the other: defaults < YAML < environment < CLI.

Each layer is a list of :class:`Setting` (an option's name, its raw strings and where they came from), read in that
order by one loop: a name that is no option is an error naming the nearest real one, each value is converted the
way argparse will convert it so that its error names its source, and the YAML and environment settings become
flags. Those flags, then the command line as given, are parsed by the schema's one parser, so a later layer wins.
:func:`train.config.validate.validate` checks the parsed values before ``TrainingArguments`` sees them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import TrainingArguments

from train.common import hub_auth
from train.common.errors import ConfigError
from train.common.hf import cache_key, cache_root
from train.common.urls import LOCAL_PROTOCOLS, is_store_url, without_credentials
from train.common.urls import URL as STORE_URL
from train.config.bounds import shown
from train.config.parser import build_parser, expected_type, option_actions
from train.config.schema import ENV_PREFIX, NON_OPTION_ENV, SECRET_FIELDS, JobArguments, env_name
from train.config.validate import validate
from train.config.yaml_file import read_yaml

REDACTED = "***"
STAGING = "staging"  # the staging directories of store output_dirs, under our cache (train/common/hf.py's cache_root)


@dataclass
class Config:
    """The resolved configuration, and where each non-default value came from."""

    job: JobArguments
    training: TrainingArguments
    sources: dict[str, str]
    # MLM_PUSH_TO_HUB as the user set it: the job pushes final/, the Trainer is told not to (see take_over_push).
    push_to_hub: bool = False
    # output_dir as the user set it when it is a store's URL (training.output_dir is then the staging directory,
    # see stage_outputs), and where it was set.
    output_store: str | None = None
    output_store_source: str = "output_dir"

    def source_of(self, name: str) -> str:
        """Where an option was set, as errors name it (``MLM_SEED``, ``job.yaml: seed``, ``--seed``), else its name."""
        return self.sources.get(name, name)

    def as_dict(self, redact: bool = True) -> dict[str, Any]:
        """The resolved options as plain JSON-able values; secrets replaced by ``***``."""
        resolved: dict[str, Any] = dataclasses.asdict(self.job)
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


@dataclass(frozen=True)
class Setting:
    """One option as one layer sets it."""

    name: str  # the field it sets (``--no_x`` sets x)
    source: str  # where it came from, as errors and Config.sources name it
    # The raw strings argparse will get ([] for a flag alone, or its ``--no_x`` negation); None for a YAML key with
    # no value, which leaves the option as it was.
    values: list[str] | None
    unknown: str  # how the error starts when name is no option
    typed: str  # what the user wrote, matched against the layer's spelling of each option for "did you mean"
    spelling: Callable[[str], str] = str
    as_flags: bool = True  # False for the command line: its arguments are parsed as given


def _yaml_layer(path: str) -> Iterator[Setting]:
    for key, value in read_yaml(path).items():
        key = str(key)
        values = None if value is None else _yaml_strings(value)
        yield Setting(key, f"{path}: {key}", values, f"{path}: unknown option {shown(key)}", key)


def _env_layer(environ: Mapping[str, str], actions: Mapping[str, argparse.Action]) -> Iterator[Setting]:
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in NON_OPTION_ENV:
            continue
        name, value = var[len(ENV_PREFIX) :].lower(), environ[var]
        action = actions.get(name)
        values = value.split(",") if action is not None and _takes_list(action) else [value]
        yield Setting(name, var, values, f"{var}: unknown option", var, env_name)


def _cli_layer(cli_args: Sequence[str], actions: Mapping[str, argparse.Action]) -> Iterator[Setting]:
    for flag, values in _cli_flags(cli_args):
        name = flag[2:]
        negated = name not in actions and name.startswith("no_") and name[3:] in actions
        field = name[3:] if negated else name
        # A negation's values are no option's (argparse refuses them later, as for any stray argument).
        yield Setting(field, flag, [] if negated else values, f"{flag}: unknown option", name, as_flags=False)


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve the configuration: defaults < YAML < environment < CLI. Raises ConfigError on bad input."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    actions = option_actions(parser)
    known = sorted(actions)
    yaml_path, cli_args = _split_config_flag(list(argv or []))
    yaml_path = yaml_path or environ.get("MLM_CONFIG") or None

    flags: list[str] = []
    sources: dict[str, str] = {}
    layers = [
        _yaml_layer(yaml_path) if yaml_path else iter(()),
        _env_layer(environ, actions),
        _cli_layer(cli_args, actions),
    ]
    for layer in layers:
        for setting in layer:
            action = actions.get(setting.name)
            if action is None:
                raise ConfigError(setting.unknown + _nearest(setting.typed, [setting.spelling(n) for n in known]))
            if setting.values is None:
                continue
            _check_value(action, setting.source, setting.values)
            if setting.as_flags:
                flags += _to_args(setting.name, action, setting.values)
            sources[setting.name] = setting.source

    full_argv = flags + cli_args
    # The values are checked before TrainingArguments.__post_init__ sees them: it crashes on some (an infinite
    # logging_steps) and rejects others without saying where they came from.
    namespace, _ = parser.parse_known_args(args=full_argv)
    validate(vars(namespace), sources)
    try:
        job, training = parser.parse_args_into_dataclasses(args=full_argv, look_for_args_file=False)
    except (ValueError, TypeError) as exc:  # TrainingArguments.__post_init__ rejects combinations
        raise ConfigError(" ".join(str(exc).split())) from None
    config = Config(job=job, training=training, sources=sources)
    split_trackers(config)
    take_over_push(config, environ)
    stage_outputs(config, environ)
    return config


def stage_outputs(config: Config, environ: Mapping[str, str]) -> None:
    """An output_dir in a store (``s3://bucket/prefix``): the job trains into a local staging directory, which
    train/outputs/mirror.py mirrors to the store, so every module that writes output_dir writes a directory. The store's
    URL moves to ``Config.output_store``; ``training.output_dir`` becomes the staging directory (MLM_STAGING_DIR,
    else one under our cache named by the URL: the same on every node and every run of that output_dir), and
    errors about the local directory name MLM_STAGING_DIR."""
    training, job = config.training, config.job
    url = STORE_URL.match(training.output_dir)
    if url and url["protocol"].lower() in LOCAL_PROTOCOLS:
        training.output_dir = training.output_dir[url.end() :]  # file:///out is /out
    if not url or not is_store_url(training.output_dir):
        if url and url["protocol"].lower() not in LOCAL_PROTOCOLS:
            raise ConfigError(
                f"{config.source_of('output_dir')}={shown(training.output_dir)}: no filesystem for "
                f"{url['protocol']}://; expected a directory or a store's URL (s3://, gs://, az://, ...)"
            )
        return
    config.output_store, config.output_store_source = training.output_dir, config.source_of("output_dir")
    staging = job.staging_dir or str(cache_root(environ) / STAGING / cache_key(training.output_dir))
    training.output_dir = os.path.abspath(os.path.expanduser(staging))
    config.sources["output_dir"] = config.sources.get("staging_dir", env_name("staging_dir"))


def _nearest(name: str, known: Sequence[str]) -> str:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f"; did you mean {match[0]}?" if match else ""


def _yaml_strings(value: Any) -> list[str]:
    """A YAML value as the strings argparse would get on a command line."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if isinstance(value, dict):
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
        raise ConfigError(f"{source}={shown(' '.join(values))}: expected one value, {expected_type(action)}")
    for raw in values:
        try:
            converted = action.type(raw) if action.type else raw
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise ConfigError(f"{source}={shown(raw)}: expected {expected_type(action)}") from None
        if action.choices and converted not in action.choices:
            raise ConfigError(f"{source}={shown(raw)}: expected {expected_type(action)}")


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


def take_over_push(config: Config, environ: Mapping[str, str]) -> None:
    """Move MLM_PUSH_TO_HUB from the Trainer to the job, and fail now (ConfigError) when the push could not work.

    MLM_PUSH_TO_HUB, MLM_HUB_MODEL_ID and MLM_HUB_PRIVATE_REPO are TrainingArguments fields, but the Trainer's own
    push creates the repository when it is built and uploads output_dir (checkpoints, logs, training_args.bin) at
    every save. The job pushes final/ instead, once, from rank 0, after final/ and run.json are written
    (train/publish/__init__.py): the Trainer gets push_to_hub=False, Config.push_to_hub keeps the choice, and what
    the push needs is checked by train.common.hub_auth before any training rather than after it."""
    training = config.training
    config.push_to_hub, training.push_to_hub = bool(training.push_to_hub), False
    if config.push_to_hub:
        repo = f"{config.source_of('hub_model_id')}={shown(training.hub_model_id)}"
        source = config.source_of("push_to_hub")
        hub_auth.check_push(training.hub_model_id, training.hub_token, environ, source=source, repo=repo)


def split_trackers(config: Config) -> None:
    """MLM_REPORT_TO=mlflow,wandb (YAML ``report_to: mlflow,wandb``) names two trackers. TrainingArguments.report_to
    is one string to argparse, so the list arrives whole, and the Trainer would look for a tracker called
    ``mlflow,wandb``: it is split here. (The Trainer checks the names; importing its list here would cost the
    launcher seconds.)"""
    training = config.training
    names = [name.strip() for entry in training.report_to or () for name in str(entry).split(",") if name.strip()]
    training.report_to = [] if names == ["none"] else names
