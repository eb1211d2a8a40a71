"""The layers of the configuration, one over the other: defaults < recipe < YAML < environment < CLI.

Each layer is a list of :class:`Setting` (an option's name, its raw strings and where they came from), read in that
order by one loop: a name that is no option is an error naming the nearest real one, each value is converted the
way argparse will convert it so that its error names its source, and the YAML and environment settings become
flags. Those flags, then the command line as given, are parsed by the schema's one parser, so a later layer wins.
:func:`train.config.validate.validate` checks the parsed values before ``TrainingArguments`` sees them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from train.common.errors import ConfigError
from train.config.bounds import shown
from train.config.implied import split_trackers, stage_outputs, take_over_push
from train.config.parser import build_parser, expected_type, option_actions
from train.config.phases import PHASES_KEY
from train.config.recipes import RECIPES, recipe_for, recipe_source
from train.config.resolved import Config
from train.config.schema import ENV_PREFIX, NON_OPTION_ENV, env_name
from train.config.sections import SECTIONS
from train.config.validate import validate
from train.config.yaml_file import read_yaml


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
        if key == PHASES_KEY:  # the phase plan, no option: the launcher runs it (train/config/phases.py)
            continue
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


def _recipe_layer(given: Sequence[Setting], actions: Mapping[str, argparse.Action]) -> Iterator[Setting]:
    """The recipe's values (train/config/recipes.py), under everything set: the recipe and the model are the last
    values the other layers give them (their defaults otherwise)."""
    last = {setting.name: setting.values for setting in given if setting.values}
    choice = (last.get("recipe") or [str(actions["recipe"].default)])[0]
    model = (last.get("model_name_or_path") or [str(actions["model_name_or_path"].default)])[0]
    if choice not in (actions["recipe"].choices or ()):
        return  # refused with its source by the loop's check of the recipe's own setting
    name = recipe_for(choice, model)
    for option, value in RECIPES[name].items():
        yield Setting(option, recipe_source(name, option), [value], f"recipe {name}: unknown option", option)


def _cli_layer(cli_args: Sequence[str], actions: Mapping[str, argparse.Action]) -> Iterator[Setting]:
    for flag, values in _cli_flags(cli_args):
        name = flag[2:]
        negated = name not in actions and name.startswith("no_") and name[3:] in actions
        field = name[3:] if negated else name
        # A negation's values are no option's (argparse refuses them later, as for any stray argument).
        yield Setting(field, flag, [] if negated else values, f"{flag}: unknown option", name, as_flags=False)


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve the configuration: defaults < recipe < YAML < environment < CLI. Raises ConfigError on bad input."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    actions = option_actions(parser)
    known = sorted(actions)
    _, cli_args = _split_config_flag(list(argv or []))
    yaml_path = config_file(argv or [], environ)

    flags: list[str] = []
    sources: dict[str, str] = {}
    given = [
        *(_yaml_layer(yaml_path) if yaml_path else ()),
        *_env_layer(environ, actions),
        *_cli_layer(cli_args, actions),
    ]
    for setting in [*_recipe_layer(given, actions), *given]:
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
        *sections, training = parser.parse_args_into_dataclasses(args=full_argv, look_for_args_file=False)
    except (ValueError, TypeError) as exc:  # TrainingArguments.__post_init__ rejects combinations
        raise ConfigError(" ".join(str(exc).split())) from None
    parts = {name: part for (name, _), part in zip(SECTIONS, sections, strict=True)}
    config = Config(**parts, training=training, sources=sources)
    split_trackers(config)
    take_over_push(config, environ)
    stage_outputs(config, environ)
    return config


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
            converted = action.type(raw) if callable(action.type) else raw
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise ConfigError(f"{source}={shown(raw)}: expected {expected_type(action)}") from None
        if action.choices and converted not in action.choices:
            raise ConfigError(f"{source}={shown(raw)}: expected {expected_type(action)}")


def config_file(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The YAML layer's file: ``--config PATH`` on the command line, else MLM_CONFIG; None for none."""
    path, _ = _split_config_flag(list(argv))
    return path or environ.get("MLM_CONFIG") or None


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
