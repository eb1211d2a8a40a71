"""The YAML layer's file (``MLM_CONFIG=path`` or ``--config path``): a mapping of option: value, each key once."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from train.common.errors import ConfigError, first_line
from train.config.bounds import SHOWN_CHARS, shown

# The presets, beside the train package: configs/ at the checkout's root, /opt/mlm-trainer/configs in the image.
PRESETS = Path(__file__).resolve().parents[2] / "configs"


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
    """The options in a YAML file (an empty file has none); ConfigError when it is missing or no such mapping."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"MLM_CONFIG/--config: no such file {path!r}; {_preset_hint(path)}")
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{path}: {shown(exc.key)} is set twice (lines {exc.first} and {exc.second}); expected each key once"
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError, OSError, ValueError) as exc:  # ValueError: an int of 4300+ digits
        raise ConfigError(
            f"{path}: not valid YAML ({first_line(exc, 2 * SHOWN_CHARS)}); expected a mapping of option: value"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option: value, got {type(data).__name__}")
    return data


def _preset_hint(path: str) -> str:
    """For a file that is not there, the preset its name is nearest (``bert-base``: configs/bert-base.yaml), as the
    user can type it: relative to the working directory when it is under it, as in the README's commands."""
    presets = {preset.stem: preset for preset in sorted(PRESETS.glob("*.yaml"))}
    name = Path(path).name.removesuffix(".yaml").removesuffix(".yml")
    near = difflib.get_close_matches(name, presets, n=1)
    if not near:
        return f"expected a YAML file of options, such as a preset in {_as_typed(PRESETS)}/"
    return f"did you mean {str(_as_typed(presets[near[0]]))!r}?"


def _as_typed(path: Path) -> Path:
    try:
        return path.relative_to(Path.cwd())
    except (ValueError, OSError):  # elsewhere, or the working directory was removed
        return path
